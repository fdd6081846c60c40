//! `deltafin bench grammar`: what constrained decoding costs per generated token, for every
//! native tool-call format on a vocabulary the size of its family's published one, beside the
//! decode time of a model pass.
//!
//! Each vocabulary is synthetic but shaped like a real one (the 256 bytes, then words and word
//! pieces with and without a leading space, digits, punctuation runs), written in the real
//! `tiktoken.model` format with the format's marker tokens after the ranks, and loaded by the
//! real tokenizer; the grammars are the ones the server builds (a strict JSON schema for
//! `response_format`, and a forced call in each format). Each grammar is walked token by token
//! with pseudo-random logits under its full mask (the mask decides every step, as under an
//! untrained model); then the same tokens are replayed with the greedy fast path (the model's
//! own choice checked against the grammar without a mask, as when a trained model complies).
//! Only the constraint's work is timed.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use base64::Engine as _;
use clap::Args;
use deltafin_engine::constrain::Vocabulary;
use deltafin_engine::generate::{ConstraintFactory, GenerateOptions, Sampling, generate};
use deltafin_engine::kernels::ops::argmax;
use deltafin_engine::synth::{KIMI_SPECIALS, Rng};
use deltafin_engine::tokenizer::Tokenizer;
use deltafin_engine::tools::grammar::{Forced, FunctionSpec, forced_call_grammar};
use deltafin_engine::tools::{ToolFormat, ToolMarkers};
use serde::Serialize;

/// Arguments of `deltafin bench grammar`.
#[derive(Debug, Args)]
pub struct GrammarBenchArgs {
    /// One vocabulary size for every format (ranks + 256 specials); default: each family's.
    #[arg(long, env = "DELTAFIN_VOCAB")]
    vocab: Option<usize>,
    /// Tokens to walk per grammar.
    #[arg(long, default_value_t = 400, env = "DELTAFIN_TOKENS")]
    tokens: usize,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "DELTAFIN_JSON")]
    json: bool,
}

/// Each format, its family, the family's published vocabulary size (`vocab_size` of the
/// config) and, for a format a checkpoint kind selects without a template, that `model_type`
/// (DSML: V3.2's `function_calls` block or V4's `tool_calls`); the tokenizer carries the
/// format's [`ToolFormat::marker_tokens`] after the ranks (K2's at K2's offsets).
const FORMATS: &[(ToolFormat, &str, usize, Option<&str>)] = &[
    (ToolFormat::KimiK2, "Kimi K2", 163_840, None),
    (ToolFormat::KimiK3, "Kimi K3", 163_840, None),
    (ToolFormat::DeepSeekV3, "DeepSeek-V3", 129_280, None),
    (ToolFormat::DeepSeekV31, "DeepSeek-V3.1", 129_280, None),
    (ToolFormat::Hermes, "Qwen3", 151_936, None),
    (ToolFormat::QwenXml, "Qwen3.5", 248_320, None),
    (ToolFormat::Glm, "GLM-4.5", 151_552, None),
    (ToolFormat::MiniMax, "MiniMax-M2", 200_064, None),
    (ToolFormat::Harmony, "gpt-oss", 201_088, None),
    (ToolFormat::Dsml, "DeepSeek-V3.2", 129_280, Some("deepseek_v32")),
    (ToolFormat::Dsml, "DeepSeek-V4", 129_280, Some("deepseek_v4")),
];

#[derive(Debug, Serialize)]
struct GrammarFigure {
    grammar: String,
    vocab: usize,
    compile_ms: f64,
    tokens: usize,
    /// The full mask every token (an untrained model).
    mask_us_per_token: f64,
    mask_us_p99: f64,
    /// The greedy fast path on the same tokens (the model's choice checked without a mask).
    fast_us_per_token: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    grammars: Vec<GrammarFigure>,
    /// Decode time per token of the built-in model (one sequence, in memory).
    decode_ms_per_token: f64,
}

/// The rank strings: the 256 bytes, then unique pieces until `ranks` are made.
fn pieces(ranks: usize) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
    let mut seen: std::collections::HashSet<Vec<u8>> = out.iter().cloned().collect();
    let mut rng = Rng::new(0x7ab1e);
    let letters = b"etaoinshrdlucmfwypvbgkjqxz";
    let punct = b".,:;!?\"'()[]{}<>/-_=+*#";
    while out.len() < ranks {
        let kind = rng.next_u64() % 10;
        let mut p = Vec::new();
        match kind {
            0 => p.extend(format!("{}", rng.next_u64() % 1000).bytes()),
            1 => (0..1 + rng.next_u64() % 3)
                .for_each(|_| p.push(punct[(rng.next_u64() % punct.len() as u64) as usize])),
            _ => {
                if kind < 7 {
                    p.push(b' ');
                }
                let len = 2 + (rng.next_u64() % 9) as usize;
                for i in 0..len {
                    // Skewed letter choice, like real text.
                    let r = rng.next_u64() % (letters.len() as u64 * letters.len() as u64);
                    let c = letters[(r as f64).sqrt() as usize % letters.len()];
                    p.push(if i == 0 && kind == 9 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    });
                }
            }
        }
        if seen.insert(p.clone()) {
            out.push(p);
        }
    }
    out
}

/// Write a `tiktoken.model` + `tokenizer_config.json` of `vocab` ids into `dir`: K2's specials
/// at K2's offsets after the ranks, and `markers` after them.
fn write_vocab(dir: &Path, vocab: usize, markers: &[&str]) -> Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let ranks = vocab.checked_sub(256).context("--vocab must be at least 512")?;
    let mut text = String::with_capacity(ranks * 16);
    for (i, p) in pieces(ranks).iter().enumerate() {
        let _ = writeln!(text, "{} {i}", b64.encode(p));
    }
    std::fs::write(dir.join("tiktoken.model"), text)?;
    let mut added = serde_json::Map::new();
    let taken: Vec<&str> = KIMI_SPECIALS.iter().map(|&(_, n)| n).collect();
    let extra = markers.iter().filter(|m| !taken.contains(m));
    let free = (0..256).filter(|o| !KIMI_SPECIALS.iter().any(|&(k, _)| k == *o));
    let all = KIMI_SPECIALS.iter().copied().chain(free.zip(extra.copied()));
    for (offset, name) in all {
        added.insert(
            (ranks + offset).to_string(),
            serde_json::json!({"content": name, "special": true}),
        );
    }
    let config = serde_json::json!({
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "added_tokens_decoder": added,
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec_pretty(&config)?,
    )?;
    Ok(())
}

/// Walk `factory`'s grammar for up to `tokens` tokens under the full mask (restarting when it
/// ends); returns the per-token times in microseconds and the runs of tokens walked.
fn walk(
    factory: &dyn ConstraintFactory,
    vocab: usize,
    tokens: usize,
    ends: &[u32],
) -> Result<(Vec<f64>, Vec<Vec<u32>>)> {
    let mut rng = Rng::new(11);
    let mut times = Vec::with_capacity(tokens);
    let mut runs = vec![Vec::new()];
    let mut c = factory.start()?;
    let mut logits = vec![0f32; vocab];
    while times.len() < tokens {
        logits
            .iter_mut()
            .for_each(|x| *x = (rng.next_u64() % 10_000) as f32);
        let t = Instant::now();
        let masked = c.mask(&mut logits);
        let token = argmax(&logits) as u32;
        let accepted = masked.and_then(|_| c.accept(token));
        times.push(t.elapsed().as_secs_f64() * 1e6);
        let run = runs.last_mut().expect("a run");
        if accepted.is_ok() {
            run.push(token);
        }
        // The output ended (an end token), failed, or got long: start again.
        if accepted.is_err() || run.len() > 2000 || ends.contains(&token) {
            c = factory.start()?;
            runs.push(Vec::new());
        }
    }
    Ok((times, runs))
}

/// Replay `runs` through the greedy fast path: each token is the model's choice, checked with
/// `allows` (the mask only where that cannot tell); per-token microseconds.
fn replay_fast(factory: &dyn ConstraintFactory, vocab: usize, runs: &[Vec<u32>]) -> Result<Vec<f64>> {
    let mut times = Vec::new();
    let mut logits = vec![0f32; vocab];
    for run in runs {
        let mut c = factory.start()?;
        for &token in run {
            let t = Instant::now();
            if c.allows(token)? != Some(true) {
                c.mask(&mut logits)?;
            }
            c.accept(token)?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(times)
}

fn mean(times: &[f64]) -> f64 {
    times.iter().sum::<f64>() / times.len().max(1) as f64
}

fn figure(name: String, vocab: usize, compile_ms: f64, mut times: Vec<f64>, fast: &[f64]) -> GrammarFigure {
    let mask_us_per_token = mean(&times);
    times.sort_by(f64::total_cmp);
    let p99 = times.get(times.len() * 99 / 100).copied().unwrap_or(0.0);
    GrammarFigure {
        grammar: name,
        vocab,
        compile_ms,
        tokens: times.len(),
        mask_us_per_token,
        mask_us_p99: p99,
        fast_us_per_token: mean(fast),
    }
}

/// Time one compiled grammar: full mask, then the fast path on the same tokens.
fn measure(
    name: String,
    vocab: usize,
    compile_ms: f64,
    g: &dyn ConstraintFactory,
    tokens: usize,
    ends: &[u32],
) -> Result<GrammarFigure> {
    let (times, runs) = walk(g, vocab, tokens, ends)?;
    let fast = replay_fast(g, vocab, &runs)?;
    Ok(figure(name, vocab, compile_ms, times, &fast))
}

fn decode_ms_per_token(cache_dir: &Path) -> Result<f64> {
    let dir = crate::cli::run::resolve_model(None, cache_dir)?;
    let model = deltafin_engine::arch::load(&dir)?;
    let opts = GenerateOptions {
        max_new_tokens: 64,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    let mut state = model.new_state();
    let g = generate(model.as_ref(), &mut state, &[1, 2, 3, 4], &opts, |_| {
        deltafin_engine::generate::Flow::Continue
    })?;
    Ok(1e3 / g.stats.decode_tokens_per_second.max(1e-9))
}

/// The schema of the benchmark's JSON answer and of its first tool.
fn person_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
            "kind": {"enum": ["person", "robot", "other"]}
        },
        "required": ["name", "age", "tags", "kind"],
        "additionalProperties": false
    })
}

/// The figures of one format: its forced call (and, for K2, the JSON schema answer).
fn format_figures(
    (format, family, vocab, model_type): (ToolFormat, &str, usize, Option<&str>),
    markers: &[&str],
    tokens: usize,
) -> Result<Vec<GrammarFigure>> {
    let tmp = tempfile::tempdir()?;
    write_vocab(tmp.path(), vocab, markers)?;
    if let Some(kind) = model_type {
        // DSML is what DeepSeek's native encoders speak: a checkpoint of that kind without a
        // chat template.
        let config = serde_json::json!({ "model_type": kind });
        std::fs::write(tmp.path().join("config.json"), config.to_string())?;
    }
    let tok = Arc::new(Tokenizer::from_dir(tmp.path())?);
    let m = ToolMarkers::resolve(format, &tok)?;
    let index = Vocabulary::new(tok.clone(), vocab, &m.structural_ids())?;
    let ends: Vec<u32> = tok.eos_id().into_iter().chain([m.end_of_turn()]).collect();
    let mut out = Vec::new();
    if format == ToolFormat::KimiK2 {
        let t = Instant::now();
        let json = index.json_schema(person_schema())?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        out.push(measure(
            "json_schema".into(),
            vocab,
            ms,
            json.as_ref(),
            tokens,
            &ends,
        )?);
    }
    let tools = [
        FunctionSpec {
            name: "lookup_person".into(),
            parameters: person_schema(),
        },
        FunctionSpec {
            name: "get_time".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}),
        },
    ];
    let t = Instant::now();
    let lark = forced_call_grammar(&m, &tools, Forced::Required, true, false)?;
    let call = index.lark(&lark)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let name = format!("{} call ({family})", format.label());
    out.push(measure(name, vocab, ms, call.as_ref(), tokens, &ends)?);
    Ok(out)
}

pub fn run(args: GrammarBenchArgs, cache_dir: &Path) -> Result<()> {
    let mut grammars = Vec::new();
    for &(format, family, vocab, model_type) in FORMATS {
        let vocab = args.vocab.unwrap_or(vocab);
        grammars.extend(format_figures(
            (format, family, vocab, model_type),
            format.marker_tokens(),
            args.tokens,
        )?);
    }
    let report = Report {
        grammars,
        decode_ms_per_token: decode_ms_per_token(cache_dir)?,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{:<34} {:>8} {:>11} {:>7} {:>10} {:>8} {:>10}",
        "grammar", "vocab", "compile ms", "tokens", "mask us", "p99 us", "fast us"
    );
    for g in &report.grammars {
        println!(
            "{:<34} {:>8} {:>11.1} {:>7} {:>10.1} {:>8.1} {:>10.1}",
            g.grammar,
            g.vocab,
            g.compile_ms,
            g.tokens,
            g.mask_us_per_token,
            g.mask_us_p99,
            g.fast_us_per_token
        );
    }
    println!("mask us: the full mask every token; fast us: the same tokens through the greedy fast path");
    println!(
        "decode of the built-in model: {:.2} ms per token (mask / decode: {:.1}% for json_schema)",
        report.decode_ms_per_token,
        100.0 * report.grammars[0].mask_us_per_token / 1e3 / report.decode_ms_per_token
    );
    Ok(())
}
