//! The subcommands of the `deltafin` binary, one module each (`run`, `serve`, `setup` and
//! `setup-qwen`, `push`, `doctor`, `warm`, `synth`; `bench` has its own folder), and the
//! argument groups and helpers they share: the memory-budget flags ([`ooc_args`]), the drafting
//! flags ([`spec_args`]), stream-mode installs ([`stream_mode`]) and download progress
//! ([`progress`]).

pub mod doctor;
pub mod ooc_args;
pub mod plan;
pub mod progress;
pub mod push;
pub mod run;
pub mod run_local;
pub mod serve;
pub mod setup;
pub mod spec_args;
pub mod stream_mode;
pub mod synth;
pub mod warm;
