//! # deltafin-fetch
//!
//! Getting weights onto the machine, exactly and resumably:
//!
//! * sources ([`source`]): Hugging Face (`hf://ORG/REPO[@REVISION]`, pinned to a commit) and OCI
//!   artifacts (`oci://REGISTRY/REPO:TAG`, pinned to a manifest digest), both read by HTTP range;
//! * [`install()`]: plan, free-space check, parallel ranged downloads with retries, resume from
//!   sidecars after any interruption, SHA-256 (or git blob id) verification of every complete
//!   file, atomic publication, progress events ([`progress`]) and the install manifest;
//! * stream mode ([`stream`]): non-expert bytes up front, routed experts fetched on first use
//!   through the [`ExpertSource`] trait, with coalescing and crash-safe publication;
//!   [`engine_source`] hands that store to the engine's out-of-core expert cache (the engine's
//!   `RangeSource` trait: this crate depends on the engine, never the other way), and [`warm`]
//!   fetches the experts a route trace used most;
//! * progress reports to a `DeltafinModel`'s status on the Kubernetes API ([`report`]), the
//!   operator's progress channel;
//! * [`push`](source::oci::push) of an install as an OCI artifact, and read-only inspection of an
//!   install ([`inspect`]) for `deltafin doctor`.
//!
//! The crate reads no environment variables: tokens, endpoints and options come from the caller.
//! TLS is rustls with the ring provider ([`install_tls_provider`]).

pub mod artifact;
pub mod download;
pub mod engine_source;
pub mod error;
pub mod fsutil;
pub mod http;
pub mod inspect;
pub mod install;
pub mod manifest;
pub mod progress;
pub mod ranges;
pub mod report;
pub mod retry;
pub mod safetensors;
pub mod source;
pub mod staged;
pub mod stream;
pub mod verify;
pub mod warm;

pub use engine_source::EngineSource;
pub use error::{Error, Result};
pub use http::install_tls_provider;
pub use install::{InstallOptions, InstallReport, install};
pub use manifest::{Manifest, Mode};
pub use source::{Remote, SourceSpec};
pub use stream::{ExpertSource, StreamStore};
