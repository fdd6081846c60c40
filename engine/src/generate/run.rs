//! One generation: chunked multi-row prefill of the prompt, then token-by-token decode with
//! sampling, stop conditions, and a per-token callback that can stop early.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Sampling, SeqState};
use crate::arch::{LogitRows, Model, SeqInput};
use crate::error::{Error, Result};

/// Settings of one generation.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Upper bound on generated tokens.
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Ids that end generation (the model's EOS ids are added by the caller).
    pub stop_ids: Vec<u32>,
    /// Prompt rows per prefill pass.
    pub prefill_chunk: usize,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { max_new_tokens: 64, sampling: Sampling::Greedy, stop_ids: Vec::new(), prefill_chunk: 256 }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop id was generated (it is included in the output).
    Stop,
    /// `max_new_tokens` or the context limit was reached.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

/// What the callback wants after a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Timing and counts of one generation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Prompt tokens per second of prefill.
    pub prefill_tokens_per_second: f64,
    /// Generated tokens per second after the first (decode passes only).
    pub decode_tokens_per_second: f64,
}

/// Result of [`generate`].
#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub output_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub stats: GenerationStats,
}

/// Run `prompt` through `model` from `state` (which it extends) and generate.
pub fn generate(
    model: &dyn Model,
    state: &mut SeqState,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::InvalidArgument { field: "prompt", reason: "must contain at least one token".into() });
    }
    let limit = model.info().max_context;
    if state.len() + prompt.len() > limit {
        return Err(Error::ContextOverflow { needed: state.len() + prompt.len(), limit });
    }
    let chunk = opts.prefill_chunk.max(1);
    let start = Instant::now();
    let mut logits = Vec::new();
    for (i, part) in prompt.chunks(chunk).enumerate() {
        let last = (i + 1) * chunk >= prompt.len();
        let rows = if last { LogitRows::Last } else { LogitRows::None };
        logits = model.forward(&mut [SeqInput { state, tokens: part, logits: rows }], None)?;
    }
    let prefill = start.elapsed();
    let mut stats = GenerationStats { prompt_tokens: prompt.len(), ..Default::default() };
    let mut output = Vec::new();
    let mut finish = FinishReason::Length;
    let decode_start = Instant::now();
    let budget = opts.max_new_tokens.min(limit - state.len() + 1);
    while output.len() < budget {
        let token = opts.sampling.pick(&logits, state.len());
        output.push(token);
        if opts.stop_ids.contains(&token) {
            finish = FinishReason::Stop;
            break;
        }
        if on_token(token) == Flow::Stop {
            finish = FinishReason::Cancelled;
            break;
        }
        if output.len() == budget {
            break;
        }
        logits = model.forward(&mut [SeqInput { state, tokens: &[token], logits: LogitRows::Last }], None)?;
    }
    let decode = decode_start.elapsed();
    stats.generated_tokens = output.len();
    stats.prefill_seconds = prefill.as_secs_f64();
    stats.decode_seconds = decode.as_secs_f64();
    stats.prefill_tokens_per_second = rate(prompt.len(), prefill);
    stats.decode_tokens_per_second = rate(output.len().saturating_sub(1), decode);
    Ok(Generation { output_ids: output, finish_reason: finish, stats })
}

fn rate(tokens: usize, time: Duration) -> f64 {
    if time.is_zero() { 0.0 } else { tokens as f64 / time.as_secs_f64() }
}
