//! Per-architecture model code.
