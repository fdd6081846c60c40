//! The Anthropic Messages API (agent-api.md §7): `POST /v1/messages` (also with `?beta=true`,
//! as Claude Code sends it) and `POST /v1/messages/count_tokens`. A body is translated into
//! the same typed [`ChatRequest`](crate::http::openai::request::ChatRequest) the Chat Completions
//! endpoint runs ([`request`]), so tools, forced tool choice, sampling and reasoning behave
//! identically; the chat pipeline's output is rendered back as a `message` ([`response`]) or
//! the Messages event stream ([`stream`]). Errors carry Anthropic's body shape ([`error`])
//! with the statuses of the one mapping in `error.rs`. `x-api-key` is accepted besides bearer
//! auth (`auth.rs`).

pub mod error;
mod handlers;
pub mod request;
pub mod response;
pub mod stream;

pub use handlers::{count_tokens, messages};
