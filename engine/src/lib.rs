//! # deltafin-engine
//!
//! Exact-weights inference for mixture-of-experts language models: checkpoint indexing
//! ([`weights`]), typed configs ([`config`]), format-decoding batch-invariant kernels
//! ([`kernels`]), one module per architecture ([`arch`]), generation and sampling
//! ([`generate`]), tokenizers with chat templates ([`tokenizer`]) and the single engine loop
//! that batches concurrent requests ([`scheduler`]); models larger than memory run through the
//! out-of-core weight store ([`cache`]). Matrix products run on the CPU or, with the `cuda`
//! feature, a GPU ([`backend`]), with bit-identical results.
//!
//! Nothing in this crate reads environment variables or talks to the network.

pub mod arch;
pub mod backend;
pub mod builtin;
pub mod cache;
pub mod config;
pub mod constrain;
pub mod error;
pub mod generate;
pub mod histogram;
pub mod kernels;
pub mod model;
pub mod pool;
pub mod rng;
pub mod scheduler;
pub mod spec;
pub mod state;
pub mod sync;
pub mod synth;
pub mod tokenizer;
pub mod tools;
pub mod weights;

pub use error::{Error, Result};
