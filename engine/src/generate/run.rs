//! One generation: chunked multi-row prefill of the prompt, then decode with sampling, stop
//! conditions, and a per-token callback that can stop early. Each decode step runs the pending
//! token — plus, with a [`Speculator`], the drafts it proposes, verified in the same pass.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::{Sampling, SeqState};
use crate::arch::{DeviceSequence, LogitRows, Model, SeqInput, Trace};
use crate::error::{Error, Result};
use crate::spec::{Observation, Speculator, draft_budget, verify};

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
        GenerateOptions {
            max_new_tokens: 64,
            sampling: Sampling::Greedy,
            stop_ids: Vec::new(),
            prefill_chunk: 256,
        }
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

impl GenerationStats {
    /// The figures of a generation whose prefill took `prefill` and whose decode (from the
    /// first generated token on) took `decode`.
    pub fn from_timings(
        prompt_tokens: usize,
        generated_tokens: usize,
        prefill: Duration,
        decode: Duration,
    ) -> Self {
        GenerationStats {
            prompt_tokens,
            generated_tokens,
            prefill_seconds: prefill.as_secs_f64(),
            decode_seconds: decode.as_secs_f64(),
            prefill_tokens_per_second: rate(prompt_tokens, prefill),
            decode_tokens_per_second: rate(generated_tokens.saturating_sub(1), decode),
        }
    }
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
    on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation> {
    generate_with(model, state, prompt, opts, None, on_token)
}

/// [`generate`] with speculative decoding: each decode step runs the target over the pending
/// token and the drafts `spec` proposes, and emits what verification accepts (the same tokens
/// as without drafts; see [`crate::spec`]).
pub fn generate_with(
    model: &dyn Model,
    state: &mut SeqState,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut spec: Option<&mut Speculator>,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation> {
    let limit = model.info().max_context;
    check_prompt(state.len(), prompt, limit)?;
    let start = Instant::now();
    let logits = prefill(model, state, prompt, opts.prefill_chunk, spec.as_deref_mut())?;
    let prefill = start.elapsed();
    let decode_start = Instant::now();
    let mut history = prompt.to_vec();
    let mut output = Vec::new();
    let mut pending = vec![opts.sampling.pick(&logits, state.len())];
    let finish = loop {
        let (finish, emitted) = emit(&pending, opts, &mut output, &mut on_token);
        history.extend_from_slice(&emitted);
        if let Some(f) = finish {
            break f;
        }
        let budget = opts
            .max_new_tokens
            .saturating_sub(output.len())
            .min(limit - state.len());
        if budget == 0 {
            break FinishReason::Length;
        }
        pending = decode_step(model, state, &history, opts, budget, spec.as_deref_mut())?;
    };
    let decode = decode_start.elapsed();
    Ok(Generation {
        stats: GenerationStats::from_timings(prompt.len(), output.len(), prefill, decode),
        output_ids: output,
        finish_reason: finish,
    })
}

/// [`generate`] with every pass on a device ([`DeviceSequence`]: activations, caches and states
/// stay there; only the last row's logits come back). The same tokens as [`generate`] on the
/// CPU: prefill in chunks of `opts.prefill_chunk`, then one token per pass, picked, stopped
/// and limited exactly as there. `max_context` is the model's ([`crate::arch::ModelInfo`]).
pub fn generate_on_device(
    seq: &mut dyn DeviceSequence,
    max_context: usize,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation> {
    check_prompt(seq.len(), prompt, max_context)?;
    let start = Instant::now();
    let mut logits = Vec::new();
    for part in prompt.chunks(opts.prefill_chunk.max(1)) {
        logits = seq.forward(part)?;
    }
    let prefill = start.elapsed();
    let decode_start = Instant::now();
    let mut output = Vec::new();
    let mut pending = opts.sampling.pick(&logits, seq.len());
    let finish = loop {
        if let (Some(f), _) = emit(&[pending], opts, &mut output, &mut on_token) {
            break f;
        }
        if seq.len() >= max_context {
            break FinishReason::Length;
        }
        logits = seq.forward(&[pending])?;
        pending = opts.sampling.pick(&logits, seq.len());
    };
    let decode = decode_start.elapsed();
    Ok(Generation {
        stats: GenerationStats::from_timings(prompt.len(), output.len(), prefill, decode),
        output_ids: output,
        finish_reason: finish,
    })
}

/// A prompt can run from position `start`: it holds a token, and fits in `limit` positions.
fn check_prompt(start: usize, prompt: &[u32], limit: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::InvalidArgument {
            field: "prompt",
            reason: "must contain at least one token".into(),
        });
    }
    if start + prompt.len() > limit {
        return Err(Error::ContextOverflow {
            needed: start + prompt.len(),
            limit,
        });
    }
    Ok(())
}

/// Chunked prefill; returns the logits of the last prompt row. Captured hidden rows go to the
/// proposers.
fn prefill(
    model: &dyn Model,
    state: &mut SeqState,
    prompt: &[u32],
    chunk: usize,
    mut spec: Option<&mut Speculator>,
) -> Result<Vec<f32>> {
    let chunk = chunk.max(1);
    let mut logits = Vec::new();
    for (i, part) in prompt.chunks(chunk).enumerate() {
        let last = (i + 1) * chunk >= prompt.len();
        let rows = if last { LogitRows::Last } else { LogitRows::None };
        let begin = state.len();
        let mut trace = spec
            .as_deref()
            .filter(|s| !s.captures().is_empty())
            .map(|s| Trace::capture(s.captures()));
        logits = model.forward(
            &mut [SeqInput {
                state,
                tokens: part,
                logits: rows,
            }],
            trace.as_mut(),
        )?;
        state.commit_all();
        if let Some(s) = spec.as_deref_mut() {
            let hidden = trace
                .map(|t| t.rows(s.captures(), 0, part.len(), model.info().hidden_size))
                .unwrap_or_default();
            s.observe(
                model,
                &Observation {
                    start: begin,
                    tokens: part,
                    hidden: &hidden,
                },
            );
        }
    }
    Ok(logits)
}

/// One decode step from the pending token (the last of `history`): propose, run the target
/// over the pending token and the drafts, verify, commit. Returns the tokens to emit.
fn decode_step(
    model: &dyn Model,
    state: &mut SeqState,
    history: &[u32],
    opts: &GenerateOptions,
    budget: usize,
    mut spec: Option<&mut Speculator>,
) -> Result<Vec<u32>> {
    let room = model.info().max_context - state.len();
    let drafts = match spec.as_deref_mut() {
        Some(s) => {
            s.plan(model, history, draft_budget(usize::MAX, budget, room))
                .drafts
        }
        None => Vec::new(),
    };
    let mut rows = Vec::with_capacity(drafts.len() + 1);
    rows.push(*history.last().expect("history holds the pending token"));
    rows.extend_from_slice(&drafts);
    let begin = state.len();
    let kind = if drafts.is_empty() {
        LogitRows::Last
    } else {
        LogitRows::All
    };
    let mut trace = spec
        .as_deref()
        .filter(|s| !s.captures().is_empty())
        .map(|s| Trace::capture(s.captures()));
    let started = Instant::now();
    let logits = model.forward(
        &mut [SeqInput {
            state,
            tokens: &rows,
            logits: kind,
        }],
        trace.as_mut(),
    )?;
    let verify_seconds = started.elapsed().as_secs_f64();
    let vocab = model.info().vocab_size;
    let picks: Vec<u32> = logits
        .chunks_exact(vocab)
        .enumerate()
        .map(|(i, row)| opts.sampling.pick(row, begin + i + 1))
        .collect();
    let verdict = verify(&drafts, &picks, &opts.stop_ids, budget);
    state.commit(verdict.commit_rows)?;
    if let Some(s) = spec {
        s.finish(verdict.accepted, verify_seconds);
        let committed = &rows[..verdict.commit_rows];
        let hidden = trace
            .map(|t| t.rows(s.captures(), 0, committed.len(), model.info().hidden_size))
            .unwrap_or_default();
        s.observe(
            model,
            &Observation {
                start: begin,
                tokens: committed,
                hidden: &hidden,
            },
        );
    }
    Ok(verdict.emitted)
}

/// Emit `tokens` in order until a stop id (kept in the output, not passed to the callback),
/// the output limit, or the callback stops. Returns the finish reason, if reached, and the
/// tokens emitted.
fn emit(
    tokens: &[u32],
    opts: &GenerateOptions,
    output: &mut Vec<u32>,
    on_token: &mut impl FnMut(u32) -> Flow,
) -> (Option<FinishReason>, Vec<u32>) {
    let mut emitted = Vec::with_capacity(tokens.len());
    for &token in tokens {
        output.push(token);
        emitted.push(token);
        if opts.stop_ids.contains(&token) {
            return (Some(FinishReason::Stop), emitted);
        }
        if on_token(token) == Flow::Stop {
            return (Some(FinishReason::Cancelled), emitted);
        }
        if output.len() >= opts.max_new_tokens {
            return (Some(FinishReason::Length), emitted);
        }
    }
    (None, emitted)
}

fn rate(tokens: usize, time: Duration) -> f64 {
    if time.is_zero() {
        0.0
    } else {
        tokens as f64 / time.as_secs_f64()
    }
}
