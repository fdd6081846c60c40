//! `deltafin bench grammar`: what constrained decoding costs per generated token on a
//! Kimi-sized vocabulary (163,840 ids: 163,584 BPE ranks + 256 specials, K2's tool tokens at
//! K2's offsets), beside the decode time of a model pass.
//!
//! The vocabulary is synthetic but shaped like a real one (the 256 bytes, then words and word
//! pieces with and without a leading space, digits, punctuation runs), written in the real
//! `tiktoken.model` format and loaded by the real tokenizer; the grammars are the ones the
//! server builds (a strict JSON schema for `response_format`, and a forced K2 tool call). Each
//! grammar is walked token by token with pseudo-random logits under its mask (the mask decides
//! every step, as under an untrained model), timing only the mask computation and the advance.

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
    /// Vocabulary size (ranks + 256 specials).
    #[arg(long, default_value_t = 163_840, env = "DELTAFIN_VOCAB")]
    vocab: usize,
    /// Tokens to walk per grammar.
    #[arg(long, default_value_t = 400, env = "DELTAFIN_TOKENS")]
    tokens: usize,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "DELTAFIN_JSON")]
    json: bool,
}

#[derive(Debug, Serialize)]
struct GrammarFigure {
    grammar: &'static str,
    compile_ms: f64,
    tokens: usize,
    mask_us_per_token: f64,
    mask_us_p99: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    vocab: usize,
    index_ms: f64,
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

/// Write a `tiktoken.model` + `tokenizer_config.json` of `vocab` ids into `dir`.
fn write_vocab(dir: &Path, vocab: usize) -> Result<()> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let ranks = vocab.checked_sub(256).context("--vocab must be at least 512")?;
    let mut text = String::with_capacity(ranks * 16);
    for (i, p) in pieces(ranks).iter().enumerate() {
        let _ = writeln!(text, "{} {i}", b64.encode(p));
    }
    std::fs::write(dir.join("tiktoken.model"), text)?;
    let mut added = serde_json::Map::new();
    // K2's specials at K2's offsets (the tool tokens included), as the synthetic K2 tokenizer.
    for &(offset, name) in KIMI_SPECIALS {
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

/// Walk `factory`'s grammar for up to `tokens` tokens (restarting when it ends); returns the
/// per-token times in microseconds.
fn walk(factory: &dyn ConstraintFactory, vocab: usize, tokens: usize, ends: &[u32]) -> Result<Vec<f64>> {
    let mut rng = Rng::new(11);
    let mut times = Vec::with_capacity(tokens);
    let mut c = factory.start()?;
    let mut logits = vec![0f32; vocab];
    let mut since_start = 0;
    while times.len() < tokens {
        logits
            .iter_mut()
            .for_each(|x| *x = (rng.next_u64() % 10_000) as f32);
        let t = Instant::now();
        let masked = c.mask(&mut logits);
        let token = argmax(&logits) as u32;
        let accepted = masked.and_then(|_| c.accept(token));
        times.push(t.elapsed().as_secs_f64() * 1e6);
        since_start += 1;
        // The output ended (an end token), failed, or got long: start again.
        if accepted.is_err() || since_start > 2000 || ends.contains(&token) {
            c = factory.start()?;
            since_start = 0;
        }
    }
    Ok(times)
}

fn figure(name: &'static str, compile_ms: f64, mut times: Vec<f64>) -> GrammarFigure {
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    times.sort_by(f64::total_cmp);
    let p99 = times.get(times.len() * 99 / 100).copied().unwrap_or(0.0);
    GrammarFigure {
        grammar: name,
        compile_ms,
        tokens: times.len(),
        mask_us_per_token: mean,
        mask_us_p99: p99,
    }
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

pub fn run(args: GrammarBenchArgs, cache_dir: &Path) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    write_vocab(tmp.path(), args.vocab)?;
    let tok = Arc::new(Tokenizer::from_dir(tmp.path())?);
    let markers = ToolMarkers::resolve(ToolFormat::KimiK2, &tok)?;
    let t = Instant::now();
    let vocab = Vocabulary::new(tok.clone(), args.vocab, &markers.structural_ids())?;
    let index_ms = t.elapsed().as_secs_f64() * 1e3;
    let ends: Vec<u32> = tok.eos_id().into_iter().chain([markers.end_of_turn()]).collect();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
            "kind": {"enum": ["person", "robot", "other"]}
        },
        "required": ["name", "age", "tags", "kind"],
        "additionalProperties": false
    });
    let mut grammars = Vec::new();
    let t = Instant::now();
    let json = vocab.json_schema(schema.clone())?;
    grammars.push(figure(
        "json_schema",
        t.elapsed().as_secs_f64() * 1e3,
        walk(json.as_ref(), args.vocab, args.tokens, &ends)?,
    ));
    let tools = [
        FunctionSpec {
            name: "lookup_person".into(),
            parameters: schema,
        },
        FunctionSpec {
            name: "get_time".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}),
        },
    ];
    let t = Instant::now();
    let lark = forced_call_grammar(&markers, &tools, Forced::Required, true, false)?;
    let call = vocab.lark(&lark)?;
    grammars.push(figure(
        "k2_forced_call",
        t.elapsed().as_secs_f64() * 1e3,
        walk(call.as_ref(), args.vocab, args.tokens, &ends)?,
    ));
    let report = Report {
        vocab: args.vocab,
        index_ms,
        grammars,
        decode_ms_per_token: decode_ms_per_token(cache_dir)?,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "vocabulary {} ids, indexed in {:.0} ms",
        report.vocab, report.index_ms
    );
    println!(
        "{:<16} {:>11} {:>8} {:>14} {:>12}",
        "grammar", "compile ms", "tokens", "mask us/token", "p99 us"
    );
    for g in &report.grammars {
        println!(
            "{:<16} {:>11.1} {:>8} {:>14.1} {:>12.1}",
            g.grammar, g.compile_ms, g.tokens, g.mask_us_per_token, g.mask_us_p99
        );
    }
    println!(
        "decode of the built-in model: {:.2} ms per token (mask / decode: {:.1}% for json_schema)",
        report.decode_ms_per_token,
        100.0 * report.grammars[0].mask_us_per_token / 1e3 / report.decode_ms_per_token
    );
    Ok(())
}
