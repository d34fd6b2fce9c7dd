//! Nets: lists of operators run in order in a workspace (not yet implemented).
