//! The HTTP surface of `deltafin serve`: the router ([`routes`]), the API surfaces
//! ([`openai`]: chat and text completions, models; [`anthropic`]: messages; [`responses`]:
//! the Responses API), the one failure-to-status mapping ([`error`]), request bodies
//! ([`body`]), authentication ([`auth`]), probes and the metrics endpoint ([`health`]), the
//! bounded pool that prepares requests off the async threads ([`prep`]), `/tokenize` and
//! `/detokenize` ([`tokenize`]), and the
//! connection layer: each connection's first request head is checked ([`guard`], [`conn`])
//! before hyper serves it, inside the accept loop with graceful shutdown ([`shutdown`]).

pub mod anthropic;
pub mod auth;
pub mod body;
pub mod conn;
pub mod error;
pub mod guard;
pub mod health;
pub mod openai;
pub mod prep;
pub mod responses;
pub mod routes;
pub mod shutdown;
pub mod tokenize;
