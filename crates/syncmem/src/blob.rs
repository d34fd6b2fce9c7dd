//! The type-erased blob (not yet implemented).
