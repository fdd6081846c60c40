//! The `deltafin` command.
fn main() {}
