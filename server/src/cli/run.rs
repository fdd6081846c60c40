//! `deltafin run`: load a model (or the built-in default), tokenize the prompt (optionally
//! through the chat template), generate, stream text to stdout, and report statistics. On a
//! stream install the routed experts a pass selects are fetched on first use ([`crate::cli::stream_mode`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use deltafin_engine::arch::{self, DeviceSequence, Model};
use deltafin_engine::backend;
use deltafin_engine::builtin::Builtin;
use deltafin_engine::cache::{ChecksumMode, OocRuntime};
use deltafin_engine::generate::{
    Flow, GenerateOptions, GenerationStats, Sampling, generate_on_device, generate_with,
};
use deltafin_engine::spec::RequestKind;
use deltafin_engine::tokenizer::{ChatMessage, ChatOptions, IncrementalDecoder, Tokenizer};
use deltafin_engine::weights::WeightIndex;
use deltafin_fetch::EngineSource;
use serde_json::json;

use crate::cli::ooc_args::{OocArgs, describe_plan};
use crate::cli::spec_args::SpecArgs;
use crate::cli::stream_mode::{self, StreamArgs};

/// Arguments of `deltafin run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Model directory (a Hugging Face checkpoint), or `builtin:k3` (the synthetic K3 preset).
    /// Default: the built-in trained model.
    #[arg(long, env = "DELTAFIN_MODEL")]
    pub(crate) model: Option<PathBuf>,
    /// Prompt text.
    #[arg(long, env = "DELTAFIN_PROMPT")]
    pub(crate) prompt: String,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long, env = "DELTAFIN_CHAT")]
    pub(crate) chat: bool,
    /// System message for --chat.
    #[arg(long, env = "DELTAFIN_SYSTEM")]
    pub(crate) system: Option<String>,
    /// Maximum new tokens.
    #[arg(long, default_value_t = 64, env = "DELTAFIN_MAX_NEW")]
    pub(crate) max_new: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0, env = "DELTAFIN_TEMPERATURE")]
    pub(crate) temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0, env = "DELTAFIN_TOP_P")]
    pub(crate) top_p: f32,
    /// Keep only the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0, env = "DELTAFIN_TOP_K")]
    pub(crate) top_k: usize,
    /// Seed of the sampling random stream.
    #[arg(long, default_value_t = 0, env = "DELTAFIN_SEED")]
    pub(crate) seed: u64,
    /// Prompt tokens per prefill pass.
    #[arg(long, default_value_t = 256, env = "DELTAFIN_PREFILL_CHUNK")]
    pub(crate) prefill_chunk: usize,
    /// Print prefill/decode throughput on stderr.
    #[arg(long, env = "DELTAFIN_STATS")]
    pub(crate) stats: bool,
    #[command(flatten)]
    pub(crate) ooc: OocArgs,
    #[command(flatten)]
    pub(crate) spec: SpecArgs,
    #[command(flatten)]
    pub(crate) stream: StreamArgs,
    /// Print one JSON object on stdout instead of streaming text.
    #[arg(long, env = "DELTAFIN_JSON")]
    pub(crate) json: bool,
    /// Subtracted once from the logit of every token already generated (OpenAI semantics).
    #[arg(long, default_value_t = 0.0, env = "DELTAFIN_PRESENCE_PENALTY")]
    pub(crate) presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already generated.
    #[arg(long, default_value_t = 0.0, env = "DELTAFIN_FREQUENCY_PENALTY")]
    pub(crate) frequency_penalty: f32,
    /// HF-style repetition penalty over the prompt and output (1 = off).
    #[arg(long, default_value_t = 1.0, env = "DELTAFIN_REPETITION_PENALTY")]
    pub(crate) repetition_penalty: f32,
    /// Logit bias per token id: `ID:BIAS,ID:BIAS` (OpenAI `logit_bias`).
    #[arg(long, value_delimiter = ',', env = "DELTAFIN_LOGIT_BIAS")]
    pub(crate) logit_bias: Vec<String>,
    /// With --chat: the answer must be JSON valid against the schema in this file (OpenAI
    /// `response_format: json_schema`).
    #[arg(long, env = "DELTAFIN_JSON_SCHEMA")]
    pub(crate) json_schema: Option<PathBuf>,
}

/// The model directory to use: `--model DIR`, or a built-in (`builtin:k3`, or no `--model` for
/// the trained default), written into `cache_dir` on first use.
pub(crate) fn resolve_model(model: Option<PathBuf>, cache_dir: &Path) -> Result<PathBuf> {
    let builtin = match &model {
        None => Builtin::Default,
        Some(dir) => match dir.to_str().and_then(Builtin::from_model_arg) {
            None => return Ok(dir.clone()),
            Some(b) => b?,
        },
    };
    let dir = cache_dir.join(builtin.dir_name());
    if builtin
        .ensure(&dir)
        .with_context(|| format!("writing the built-in model in {}", dir.display()))?
    {
        eprintln!("wrote the built-in model in {}", dir.display());
    }
    if builtin.synthetic() {
        eprintln!(
            "note: using the built-in K3 preset at {} — its weights are SYNTHETIC (random), so its text is meaningless",
            dir.display()
        );
    } else if model.is_none() {
        eprintln!(
            "note: no --model given; using the built-in default at {} (a small MoE trained on Jane Austen; `--model builtin:k3` for the synthetic K3 preset)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The model, its out-of-core runtime (when loaded under a budget) and its stream store (a
/// stream install).
type LoadedModel = (Box<dyn Model>, Option<OocRuntime>, Option<Arc<EngineSource>>);

/// Load `dir`; under a budget, the plan holds a `context_tokens`-position state.
fn load_model(dir: &Path, args: &RunArgs, context_tokens: usize) -> Result<LoadedModel> {
    let stream = stream_mode::open(dir, &args.stream)?;
    let loading = || format!("loading model {}", dir.display());
    Ok(
        match stream_mode::ooc_options(dir, &args.ooc, stream.as_ref(), &args.stream)? {
            None => {
                let mode = args.ooc.verify_weights;
                if mode != ChecksumMode::Off {
                    let index = WeightIndex::open(dir).with_context(loading)?;
                    deltafin_server::model::verify_in_memory(&index, mode).with_context(loading)?;
                }
                (arch::load(dir).with_context(loading)?, None, stream)
            }
            Some(mut o) => {
                let spec = crate::cli::ooc_args::plan_context(dir, &mut o, context_tokens)?;
                if args.spec.draft_mtp && args.spec.spec != deltafin_engine::spec::SpecMode::Off {
                    deltafin_server::drafts::reserve_mtp(dir, &mut o).with_context(loading)?;
                }
                let (m, rt) = arch::load_budgeted_spec(&spec, dir, &o).with_context(loading)?;
                if args.stats {
                    eprintln!("{}", describe_plan(&rt.plan, &rt.read));
                }
                if let Some(note) = &rt.heat_note {
                    eprintln!("heat: {note}");
                }
                (m, Some(rt), stream)
            }
        },
    )
}

/// The prompt's token ids: rendered through the chat template, or a raw prompt exactly as the
/// model's own tokenizer encodes it (`tokenizer(text)`: a BOS only where that tokenizer adds one).
fn prompt_ids(args: &RunArgs, tok: &Tokenizer) -> Result<Vec<u32>> {
    if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system.clone()));
        }
        messages.push(ChatMessage::new("user", args.prompt.clone()));
        let opts = ChatOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        return tok
            .encode_chat(&messages, &opts)
            .context("rendering the chat template");
    }
    Ok(tok.encode_prompt(&args.prompt))
}

/// The `--json` `stats` object.
pub(crate) fn stats_json(s: &GenerationStats, load_seconds: f64) -> serde_json::Value {
    json!({ "load_seconds": load_seconds, "prompt_tokens": s.prompt_tokens,
        "generated_tokens": s.generated_tokens, "prefill_seconds": s.prefill_seconds,
        "decode_seconds": s.decode_seconds, "prefill_tokens_per_second": s.prefill_tokens_per_second,
        "decode_tokens_per_second": s.decode_tokens_per_second })
}

/// The `--stats` throughput line.
pub(crate) fn print_throughput(s: &GenerationStats, load_seconds: f64, finish: &str) {
    eprintln!(
        "prefill: {} tokens in {:.3} s ({:.1} tok/s); decode: {} tokens in {:.3} s ({:.1} tok/s); load {:.2} s; finish: {finish}",
        s.prompt_tokens,
        s.prefill_seconds,
        s.prefill_tokens_per_second,
        s.generated_tokens,
        s.decode_seconds,
        s.decode_tokens_per_second,
        load_seconds,
    );
}

/// The sequence for whole passes on the device (activations, caches and states stay there)
/// when a GPU computes; `None` on the CPU, or for an architecture without a device pass (said
/// on stderr: its matrix products still run on the device). Whole passes run one token per
/// pass, so they turn speculative decoding off (said on stderr).
fn device_pass<'m>(
    model: &'m dyn Model,
    speculating: bool,
    capacity: usize,
) -> Result<Option<Box<dyn DeviceSequence + 'm>>> {
    if backend::current().device() == backend::Device::Cpu {
        return Ok(None);
    }
    match arch::current_device_sequence(model, capacity) {
        None => Ok(None),
        Some(Ok(seq)) => {
            if speculating {
                eprintln!(
                    "note: whole passes on the device decode one token per pass; speculative decoding is off"
                );
            }
            Ok(Some(seq))
        }
        Some(Err(deltafin_engine::Error::InvalidArgument {
            field: "device",
            reason,
        })) => {
            eprintln!("note: {reason}; the matrix products run on the device");
            Ok(None)
        }
        Some(Err(e)) => Err(e).context("opening whole passes on the device"),
    }
}

/// `deltafin run`. On the CPU the request goes through the server's own path in process
/// ([`deltafin_server::local`]: the same load, prompt rendering, decode options and engine loop
/// as `serve`), so `run` and `serve` give the same ids. With a GPU computing, whole passes on
/// the device run one sequence directly ([`run_on_device`]).
pub fn run(args: RunArgs, cache_dir: &Path) -> Result<()> {
    if backend::current().device() == backend::Device::Cpu {
        return crate::cli::run_local::run(&args, cache_dir);
    }
    run_on_device(args, cache_dir)
}

/// The device path: load the model here and generate with whole passes on the device where the
/// architecture has them (its matrix products on the device otherwise).
fn run_on_device(args: RunArgs, cache_dir: &Path) -> Result<()> {
    let dir = resolve_model(args.model.clone(), cache_dir)?;
    let load_start = Instant::now();
    let tok = Arc::new(
        Tokenizer::from_dir(&dir).with_context(|| format!("loading tokenizer from {}", dir.display()))?,
    );
    let prompt_ids = prompt_ids(&args, &tok)?;
    let (model, ooc, stream) = load_model(&dir, &args, prompt_ids.len() + args.max_new)?;
    let drafts = args.spec.sources().load(&dir, model.as_ref(), &tok)?;
    let kind = if args.chat {
        RequestKind::Chat
    } else {
        RequestKind::Completion
    };
    let mut spec = drafts.speculator(kind, args.spec.spec, None);
    let load_seconds = load_start.elapsed().as_secs_f64();
    let opts = GenerateOptions {
        max_new_tokens: args.max_new,
        sampling: Sampling::new(args.temperature, args.top_p, args.top_k, args.seed)?,
        stop_ids: deltafin_server::model::stop_ids(&dir, model.info(), &tok),
        prefill_chunk: args.prefill_chunk,
    };
    let capacity = (prompt_ids.len() + args.max_new).min(model.info().max_context);
    let mut whole_pass = device_pass(model.as_ref(), spec.is_some(), capacity)?;
    if whole_pass.is_some() {
        spec = None;
    }
    let mut decoder = IncrementalDecoder::new(&tok);
    let mut stdout = std::io::stdout().lock();
    let streaming = !args.json;
    let on_token = |id| {
        if streaming && let Some(text) = decoder.push(id) {
            // A closed stdout (e.g. `| head`) stops generation instead of failing it.
            if stdout
                .write_all(text.as_bytes())
                .and_then(|_| stdout.flush())
                .is_err()
            {
                return Flow::Stop;
            }
        }
        Flow::Continue
    };
    let generation = match whole_pass.as_deref_mut() {
        Some(seq) => generate_on_device(seq, model.info().max_context, &prompt_ids, &opts, on_token)?,
        None => {
            let mut state = model.new_state();
            generate_with(
                model.as_ref(),
                &mut state,
                &prompt_ids,
                &opts,
                spec.as_mut(),
                on_token,
            )?
        }
    };
    let pass = if whole_pass.is_some() { "whole" } else { "products" };
    if let Some(rt) = &ooc {
        rt.flush_heat()?;
    }
    let ooc_stats = ooc.as_ref().map(|rt| rt.stats());
    let stream_stats = stream.as_ref().map(|s| s.store().stats());
    let text_ids: Vec<u32> = generation
        .output_ids
        .iter()
        .copied()
        .filter(|id| !opts.stop_ids.contains(id))
        .collect();
    let text = tok.decode(&text_ids);
    let s = &generation.stats;
    if args.json {
        let out = json!({
            "model": dir,
            "prompt_ids": prompt_ids,
            "output_ids": generation.output_ids,
            "text": text,
            "finish_reason": generation.finish_reason,
            "stats": stats_json(s, load_seconds),
            "out_of_core": ooc_stats,
            "stream": stream_stats,
            "speculation": spec.as_ref().map(|s| s.summary()),
            "device": { "backend": backend::current().describe(), "pass": pass,
                "stats": backend::current().stats() },
        });
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else {
        if let Some(rest) = decoder.flush() {
            stdout.write_all(rest.as_bytes())?;
        }
        writeln!(stdout)?;
    }
    if args.stats {
        print_throughput(s, load_seconds, &format!("{:?}", generation.finish_reason));
        if let Some(st) = &ooc_stats {
            eprintln!("out of core: {}", serde_json::to_string(st)?);
        }
        if let Some(st) = &stream_stats {
            eprintln!("stream: {}", serde_json::to_string(st)?);
        }
        match &spec {
            Some(s) => eprintln!("speculation ({}): {}", drafts.describe(), s.summary().describe()),
            None => eprintln!("speculation: off"),
        }
        let (b, st) = (backend::current(), backend::current().stats());
        if st == backend::BackendStats::default() {
            eprintln!("device: {}", b.describe());
        } else {
            eprintln!(
                "device: {} ({pass} passes): {}",
                b.describe(),
                serde_json::to_string(&st)?
            );
        }
    }
    Ok(())
}
