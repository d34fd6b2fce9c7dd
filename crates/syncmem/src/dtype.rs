//! Element types (not yet implemented).
