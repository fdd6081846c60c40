//! The OpenAI Responses API subset agents use (agent-api.md §6): `POST /v1/responses`. A body
//! is translated into the same typed [`ChatRequest`](crate::http::openai::request::ChatRequest) the
//! Chat Completions endpoint runs ([`request`], [`input`]), so tools, forced tool choice,
//! `text.format` constraints, sampling and reasoning behave identically; the chat pipeline's
//! output is rendered back as a `response` object ([`object`]) or the Responses event stream
//! ([`stream`]). `previous_response_id` continues a conversation kept in a bounded in-memory
//! LRU ([`store`]); an unknown id is a 400 naming the field.

mod handlers;
pub mod input;
pub mod object;
pub mod request;
pub mod store;
pub mod stream;

pub use handlers::responses;
pub use store::ResponseStore;
