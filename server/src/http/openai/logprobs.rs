//! Log-probabilities in OpenAI's two shapes (pure): chat's `logprobs.content[]` entries
//! (`token`, `logprob`, `bytes`, `top_logprobs`) and completions' parallel arrays (`tokens`,
//! `token_logprobs`, `top_logprobs` maps, `text_offset`). Values are the engine's fp32
//! log-softmax of the processed logits (after bias, penalties and any constraint mask); a
//! token's text is its bytes decoded lossily, a special token's its name.

use serde::Serialize;
use serde_json::{Map, Value};

use deltafin_engine::generate::TokenLogprobs;
use deltafin_engine::tokenizer::Tokenizer;

/// `choices[].logprobs` of a chat completion or chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<LogprobToken>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogprobToken {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// `choices[].logprobs` of a completion or chunk.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

/// A token's bytes and text.
fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    if tok.is_special(id) {
        let name = tok.id_to_token(id).unwrap_or_default();
        return (name.clone(), name.into_bytes());
    }
    let bytes = tok.decode_bytes(&[id]);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// A log-probability as JSON can carry it (`-inf` becomes the most negative f32).
fn finite(x: f32) -> f32 {
    if x.is_finite() { x } else { f32::MIN }
}

/// Chat entries for `lps` (`None` when there are none).
pub fn chat(tok: &Tokenizer, lps: &[TokenLogprobs]) -> Option<ChatLogprobs> {
    if lps.is_empty() {
        return None;
    }
    let content = lps
        .iter()
        .map(|lp| {
            let (token, bytes) = piece(tok, lp.token);
            let top_logprobs = lp
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let (token, bytes) = piece(tok, id);
                    TopLogprob {
                        token,
                        logprob: finite(logprob),
                        bytes,
                    }
                })
                .collect();
            LogprobToken {
                token,
                logprob: finite(lp.logprob),
                bytes,
                top_logprobs,
            }
        })
        .collect();
    Some(ChatLogprobs { content })
}

/// Completions arrays for `lps`; `offset` is the text length produced before them.
pub fn completion(tok: &Tokenizer, lps: &[TokenLogprobs], offset: &mut usize) -> Option<CompletionLogprobs> {
    if lps.is_empty() {
        return None;
    }
    let mut out = CompletionLogprobs {
        tokens: Vec::with_capacity(lps.len()),
        token_logprobs: Vec::with_capacity(lps.len()),
        top_logprobs: Vec::with_capacity(lps.len()),
        text_offset: Vec::with_capacity(lps.len()),
    };
    for lp in lps {
        let (token, _) = piece(tok, lp.token);
        out.text_offset.push(*offset);
        *offset += token.len();
        out.tokens.push(token);
        out.token_logprobs.push(finite(lp.logprob));
        let top = lp
            .top
            .iter()
            .map(|&(id, x)| (piece(tok, id).0, Value::from(finite(x))))
            .collect();
        out.top_logprobs.push(top);
    }
    Some(out)
}
