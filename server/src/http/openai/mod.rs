//! The OpenAI-compatible API: request validation, response types and SSE chunks, the output
//! state machine (reasoning split, stop strings), and the handlers that tie them to the engine.

pub mod chat;
pub mod generation;
pub mod handlers;
#[cfg(test)]
mod harmony_oracle_tests;
pub mod logprobs;
pub mod output;
pub mod reasoning;
pub mod request;
pub mod stop;
pub mod types;
