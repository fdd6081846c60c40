//! # deltafin (server library)
//!
//! The OpenAI-compatible HTTP server behind `deltafin serve`: [`app`] builds the axum router
//! over an [`AppState`]; handlers validate requests into typed values ([`openai::request`]),
//! tokenize, and hand them to the single engine loop
//! ([`deltafin_engine::scheduler`]) over channels; responses are JSON or SSE built by pure
//! functions ([`openai::types`], [`openai::output`]). [`error::ApiError`] is the one mapping
//! from failures to HTTP statuses. Health probes and Prometheus metrics live in [`health`] and
//! [`metrics`]; the accept loop and graceful shutdown in [`shutdown`], which checks each
//! connection's first request head ([`http_guard`], [`http_conn`]) before hyper serves it.
//!
//! Nothing here reads environment variables: `main` parses flags (each with a `DELTAFIN_*`
//! variable) into a [`state::ServerConfig`].

pub mod anthropic;
pub mod auth;
pub mod body;
pub mod drafts;
pub mod error;
pub mod health;
pub mod http_conn;
pub mod http_guard;
pub mod metrics;
pub mod model;
pub mod openai;
pub mod responses;
pub mod routes;
pub mod shutdown;
pub mod state;

pub use routes::app;
pub use state::{AppState, ServerConfig};
