//! `deltafin run` on the CPU: the prompt and options become an OpenAI request body (a
//! `/v1/completions` body, or with `--chat` a `/v1/chat/completions` one) that goes through the
//! server's own path in process ([`deltafin_server::local`]): the model is loaded as `serve`
//! loads it, the prompt rendered and the decode options built by the same code, and the tokens
//! come from the same engine loop. Output (streamed text, or `--json`) is what `run` always
//! printed.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use deltafin_engine::backend;
use deltafin_engine::scheduler::{ExpertIoStats, SchedulerConfig};
use deltafin_engine::tokenizer::IncrementalDecoder;
use deltafin_server::local::{self, LocalEndpoint, LocalOutcome};
use deltafin_server::metrics::{BuildInfo, Metrics};
use deltafin_server::{AppState, ServerConfig, model};
use serde_json::{Value, json};

use super::run::{RunArgs, print_throughput, resolve_model, stats_json};
use crate::cli::ooc_args::describe_plan;
use crate::cli::stream_mode;

/// The request body `args` stand for, and its endpoint.
pub(crate) fn request_body(args: &RunArgs, model_id: &str) -> Result<(LocalEndpoint, Value)> {
    let mut body = json!({
        "model": model_id, "max_tokens": args.max_new, "temperature": args.temperature,
        "top_p": args.top_p, "top_k": args.top_k, "seed": args.seed,
        "presence_penalty": args.presence_penalty, "frequency_penalty": args.frequency_penalty,
        "repetition_penalty": args.repetition_penalty,
    });
    if !args.logit_bias.is_empty() {
        let mut bias = serde_json::Map::new();
        for item in &args.logit_bias {
            let (id, value) = item
                .split_once(':')
                .with_context(|| format!("--logit-bias {item}: expected ID:BIAS"))?;
            let value: f64 = value
                .trim()
                .parse()
                .with_context(|| format!("--logit-bias {item}: the bias is not a number"))?;
            bias.insert(id.trim().to_string(), json!(value));
        }
        body["logit_bias"] = Value::Object(bias);
    }
    if !args.chat {
        if args.json_schema.is_some() {
            bail!("--json-schema needs --chat (it is the chat answer's response format)");
        }
        body["prompt"] = json!(args.prompt);
        return Ok((LocalEndpoint::Completions, body));
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": args.prompt}));
    body["messages"] = json!(messages);
    if let Some(path) = &args.json_schema {
        let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let schema: Value =
            serde_json::from_slice(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        body["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}});
    }
    Ok((LocalEndpoint::Chat, body))
}

/// Load the model in `dir` as `serve` does and hold it in an in-process server state.
fn load(args: &RunArgs, dir: &Path) -> Result<(AppState, Option<Arc<deltafin_fetch::EngineSource>>)> {
    let stream = stream_mode::open(dir, &args.stream)?;
    let ooc = stream_mode::ooc_options(dir, &args.ooc, stream.as_ref(), &args.stream)?;
    let mut config = ServerConfig {
        spec: args.spec.spec,
        ..ServerConfig::default()
    };
    config.limits.max_tokens = config.limits.max_tokens.max(args.max_new);
    let sched = SchedulerConfig {
        max_batch: 1,
        prefill_chunk: args.prefill_chunk.max(1),
        prefill_chunk_solo: args.prefill_chunk.max(1),
        ..SchedulerConfig::default()
    };
    let verify = args.ooc.verify_weights;
    let (loaded, _thread) = model::load(
        dir,
        model::default_model_id(dir),
        sched,
        ooc.as_ref(),
        verify,
        &args.spec.sources(),
    )
    .with_context(|| format!("loading model {}", dir.display()))?;
    if let Some(rt) = &loaded.ooc {
        if args.stats {
            eprintln!("{}", describe_plan(&rt.plan, &rt.read));
        }
        if let Some(note) = &rt.heat_note {
            eprintln!("heat: {note}");
        }
    }
    let metrics = Arc::new(Metrics::new(BuildInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        device: backend::current().device().to_string(),
        spine: "native".into(),
        exact: true,
    }));
    let state = AppState::new(config, metrics, Arc::new(ExpertIoStats::default()));
    state.set_loaded(loaded);
    Ok((state, stream))
}

/// Run the request, streaming text to stdout unless `--json`.
fn generate(args: &RunArgs, state: &AppState, endpoint: LocalEndpoint, body: &Value) -> Result<LocalOutcome> {
    let loaded = state.loaded().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut decoder = IncrementalDecoder::new(&loaded.tokenizer);
    let mut stdout = std::io::stdout().lock();
    let mut shown = 0;
    let mut closed = false;
    let on_ids = |ids: &[u32]| {
        if args.json {
            return true;
        }
        for &id in &ids[shown..] {
            if let Some(text) = decoder.push(id) {
                // A closed stdout (e.g. `| head`) stops generation instead of failing it.
                closed |= stdout
                    .write_all(text.as_bytes())
                    .and_then(|_| stdout.flush())
                    .is_err();
            }
        }
        shown = ids.len();
        !closed
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut outcome = runtime
        .block_on(local::request(state, endpoint, body, on_ids))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if closed {
        outcome.finish_reason = "cancelled";
    }
    if !args.json {
        if let Some(rest) = decoder.flush() {
            stdout.write_all(rest.as_bytes())?;
        }
        writeln!(stdout)?;
    }
    Ok(outcome)
}

/// `deltafin run` on the CPU (see the module docs).
pub(crate) fn run(args: &RunArgs, cache_dir: &Path) -> Result<()> {
    let dir = resolve_model(args.model.clone(), cache_dir)?;
    let load_start = Instant::now();
    let (state, stream) = load(args, &dir)?;
    let load_seconds = load_start.elapsed().as_secs_f64();
    let loaded = state.loaded().map_err(|e| anyhow::anyhow!("{e}"))?;
    let (endpoint, body) = request_body(args, &loaded.model_id)?;
    let out = generate(args, &state, endpoint, &body)?;
    if let Some(rt) = &loaded.ooc {
        rt.flush_heat()?;
    }
    let report = Report {
        out: &out,
        load_seconds,
        ooc: loaded.ooc.as_ref().map(|rt| rt.stats()),
        stream: stream.as_ref().map(|s| s.store().stats()),
        speculation: loaded.engine.stats().speculation(),
    };
    let text_ids: Vec<u32> = out
        .output_ids
        .iter()
        .copied()
        .filter(|id| !loaded.stop_ids.contains(id) && !loaded.chat_stop_ids.contains(id))
        .collect();
    let text = loaded.tokenizer.decode(&text_ids);
    if args.json {
        println!("{}", serde_json::to_string(&report.json(&dir, &text))?);
    }
    if args.stats {
        report.print(args.spec.spec != deltafin_engine::spec::SpecMode::Off)?;
    }
    Ok(())
}

/// What `run` reports.
struct Report<'a> {
    out: &'a LocalOutcome,
    load_seconds: f64,
    ooc: Option<deltafin_engine::cache::OocStats>,
    stream: Option<deltafin_fetch::stream::StreamStats>,
    speculation: deltafin_engine::spec::SpecSummary,
}

impl Report<'_> {
    fn json(&self, dir: &Path, text: &str) -> Value {
        let o = self.out;
        json!({
            "model": dir,
            "prompt_ids": o.prompt_ids,
            "output_ids": o.output_ids,
            "text": text,
            "finish_reason": o.finish_reason,
            "stats": stats_json(&o.stats, self.load_seconds),
            "out_of_core": self.ooc,
            "stream": self.stream,
            "speculation": self.speculation,
            "device": { "backend": backend::current().describe(), "pass": "products",
                "stats": backend::current().stats() },
        })
    }

    fn print(&self, speculating: bool) -> Result<()> {
        print_throughput(&self.out.stats, self.load_seconds, self.out.finish_reason);
        if let Some(st) = &self.ooc {
            eprintln!("out of core: {}", serde_json::to_string(st)?);
        }
        if let Some(st) = &self.stream {
            eprintln!("stream: {}", serde_json::to_string(st)?);
        }
        match speculating {
            true => eprintln!("speculation: {}", self.speculation.describe()),
            false => eprintln!("speculation: off"),
        }
        eprintln!("device: {}", backend::current().describe());
        Ok(())
    }
}
