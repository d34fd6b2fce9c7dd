//! Device kernels (not yet implemented).
