//! Building and running the CPU emulators of the CUDA sources (`tests/cuda_emulator/*.cpp`):
//! compiled once per test run with g++ (C++20, IEEE single precision without contraction), fed
//! one request on stdin, answered on stdout.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Compile `tests/cuda_emulator/{source}` to `{name}` in the test's temporary directory.
/// `None` when there is no g++ (the tests then skip, unless `DELTAFIN_REQUIRE_SERVICES=1`).
pub fn compile(source: &str, name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cuda_emulator")
        .join(source);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new("g++")
        .args([
            "-std=c++20",
            "-O2",
            "-ffp-contract=off",
            "-fno-fast-math",
            "-pthread",
        ])
        .args(["-Wall", "-Wno-unknown-pragmas", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        Ok(s) => panic!("the CUDA source does not compile in the emulator ({source}): {s}"),
        Err(e) => {
            let required = std::env::var_os("DELTAFIN_REQUIRE_SERVICES").is_some_and(|v| v == "1");
            assert!(!required, "g++ is required (DELTAFIN_REQUIRE_SERVICES=1): {e}");
            eprintln!("skipping: no g++ ({e})");
            None
        }
    }
}

/// Run `bin` on `input`; its stdout.
pub fn run(bin: &Path, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "emulator failed: {}", out.status);
    out.stdout
}
