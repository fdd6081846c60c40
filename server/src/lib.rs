//! # deltafin (server library)
//!
//! The OpenAI-compatible HTTP server behind `deltafin serve`: [`app`] builds the axum router
//! over an [`AppState`]; handlers validate requests into typed values ([`http::openai::request`]),
//! tokenize, and hand them to the single engine loop
//! ([`deltafin_engine::scheduler`]) over channels; responses are JSON or SSE built by pure
//! functions ([`http::openai::types`], [`http::openai::output`]). [`http::error::ApiError`] is the one mapping
//! from failures to HTTP statuses. Health probes and Prometheus metrics live in [`http::health`] and
//! [`metrics`]; the accept loop and graceful shutdown in [`http::shutdown`], which checks each
//! connection's first request head ([`http::guard`], [`http::conn`]) before hyper serves it.
//!
//! Nothing here reads environment variables: `main` parses flags (each with a `DELTAFIN_*`
//! variable) into a [`state::ServerConfig`].

pub mod drafts;
pub mod http;
pub mod local;
pub mod metrics;
pub mod model;
pub mod state;

pub use http::routes::app;
pub use state::{AppState, ServerConfig};
