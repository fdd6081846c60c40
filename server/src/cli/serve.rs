//! `deltafin serve`: the OpenAI-compatible server. Binds first (so `/livez` answers and
//! `/readyz` says 503 while the model loads), loads the model on a blocking thread, then serves
//! until SIGTERM/SIGINT and drains within `--shutdown-timeout`. A stream install is served like
//! a full one; each routed expert is fetched on first use ([`crate::cli::stream_mode`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use deltafin_engine::scheduler::{ExpertIoStats, SchedulerConfig};
use deltafin_server::http::openai::request::Limits;
use deltafin_server::http::shutdown;
use deltafin_server::metrics::{BuildInfo, Metrics};
use deltafin_server::{AppState, ServerConfig, model};

/// Arguments of `deltafin serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory (a Hugging Face checkpoint), or `builtin:k3` (the synthetic K3 preset).
    /// Default: the built-in trained model.
    #[arg(long, env = "DELTAFIN_MODEL")]
    model: Option<PathBuf>,
    /// Address to listen on (loopback by default; use 0.0.0.0 in a container).
    #[arg(long, default_value = "127.0.0.1", env = "DELTAFIN_HOST")]
    host: String,
    /// Port (0 picks a free one; the chosen address is printed on stderr).
    #[arg(long, default_value_t = 8000, env = "DELTAFIN_PORT")]
    port: u16,
    /// File holding the bearer API key required on /v1/* (surrounding whitespace ignored).
    #[arg(long, env = "DELTAFIN_API_KEY_FILE")]
    api_key_file: Option<PathBuf>,
    /// Ceiling for a request's max_tokens (also the chat default).
    #[arg(long, default_value_t = 1_000_000, env = "DELTAFIN_MAX_TOKENS")]
    max_tokens: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = 32 << 20, env = "DELTAFIN_MAX_REQUEST_BYTES")]
    max_request_bytes: usize,
    /// Requests that may wait for a batch slot; beyond that, 429 with Retry-After.
    #[arg(long, default_value_t = 32, env = "DELTAFIN_MAX_QUEUE")]
    max_queue: usize,
    /// Context limit in tokens (prompt + output), capped by the model's.
    #[arg(long, env = "DELTAFIN_CONTEXT_LIMIT")]
    context_limit: Option<usize>,
    /// Requests decoded together in one batched pass.
    #[arg(long, default_value_t = 8, env = "DELTAFIN_MAX_BATCH")]
    max_batch: usize,
    /// Prompt tokens per pass, shared by the requests being prefilled.
    #[arg(long, default_value_t = 256, env = "DELTAFIN_PREFILL_CHUNK")]
    prefill_chunk: usize,
    /// Prompt tokens per pass for a prompt prefilling alone (nothing decoding, nobody waiting):
    /// it delays no one, and out of core each chunk reads the experts it touches once, so
    /// larger chunks read less per token. The positions budget scales alike.
    #[arg(long, default_value_t = deltafin_engine::scheduler::DEFAULT_PREFILL_CHUNK_SOLO, env = "DELTAFIN_PREFILL_CHUNK_SOLO")]
    prefill_chunk_solo: usize,
    /// Attended positions per pass for prefill rows (a row at position p attends p + 1): bounds
    /// one step's attention cost, so a long prompt's later chunks get shorter and running streams
    /// and new short requests wait at most about one bounded step for it.
    #[arg(long, default_value_t = deltafin_engine::scheduler::DEFAULT_PREFILL_POSITIONS, env = "DELTAFIN_PREFILL_POSITIONS")]
    prefill_positions: usize,
    /// Milliseconds a step may add for prefill: the prefill budget above is scaled down by the
    /// measured cost of recent steps so a long prompt delays running streams and new requests by
    /// about this much per step (0: always the whole budget).
    #[arg(long, default_value_t = deltafin_engine::scheduler::DEFAULT_PREFILL_STEP.as_millis() as u64, env = "DELTAFIN_PREFILL_STEP_MS")]
    prefill_step_ms: u64,
    /// Conversation states kept for reuse (0 disables reuse).
    #[arg(long, default_value_t = 4, env = "DELTAFIN_STATE_CACHE")]
    state_cache: usize,
    /// Recurrent-state (KDA) checkpoints a prompt keeps at its prefill chunk ends, so K3 and
    /// Kimi-Linear prompts sharing only a prefix with a cached one reuse it (0: exact
    /// extensions only).
    #[arg(long, default_value_t = deltafin_engine::scheduler::DEFAULT_STATE_CHECKPOINTS, env = "DELTAFIN_STATE_CHECKPOINTS")]
    state_checkpoints: usize,
    /// Model id served by /v1/models (default: the model directory's name).
    #[arg(long, env = "DELTAFIN_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// Seconds between SSE keep-alive comments while a stream has nothing to send.
    #[arg(long, default_value_t = 15.0, env = "DELTAFIN_SSE_KEEP_ALIVE")]
    sse_keep_alive: f64,
    /// Seconds in-flight requests get to finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30.0, env = "DELTAFIN_SHUTDOWN_TIMEOUT")]
    shutdown_timeout: f64,
    /// `/livez` fails (503) when the engine loop has made no progress for this many seconds
    /// while requests are in flight, or when it has stopped, so Kubernetes restarts the pod.
    /// Longer than the slowest single step (a long prefill chunk, a cold out-of-core pass).
    #[arg(long, default_value_t = 120.0, env = "DELTAFIN_LIVENESS_STALL")]
    liveness_stall: f64,
    /// Threads preparing requests at once (chat-template rendering, tokenization, grammar
    /// compilation), off the async threads; default: one per core, at least two.
    #[arg(long, env = "DELTAFIN_PREP_WORKERS")]
    prep_workers: Option<usize>,
    /// Requests that may wait for a preparation thread; beyond that a request gets 429.
    #[arg(long, default_value_t = deltafin_server::http::prep::DEFAULT_QUEUE, env = "DELTAFIN_PREP_QUEUE")]
    prep_queue: usize,
    /// Log prompt text (never logged otherwise).
    #[arg(long, env = "DELTAFIN_LOG_PROMPTS")]
    log_prompts: bool,
    /// Return a malformed tool call as `content` text with its markers removed (default: it is
    /// dropped; either way it is counted in `deltafin_tool_calls_total{outcome="malformed"}`).
    #[arg(long, env = "DELTAFIN_MALFORMED_CALLS_AS_TEXT")]
    malformed_calls_as_text: bool,
    #[command(flatten)]
    ooc: crate::cli::ooc_args::OocArgs,
    #[command(flatten)]
    spec: crate::cli::spec_args::SpecArgs,
    #[command(flatten)]
    stream: crate::cli::stream_mode::StreamArgs,
    /// Testing aid: sleep this many milliseconds after every engine pass (a slow model).
    #[arg(long, default_value_t = 0, hide = true, env = "DELTAFIN_STEP_DELAY_MS")]
    step_delay_ms: u64,
}

fn seconds(v: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| anyhow::anyhow!("--{flag} must be a non-negative number of seconds"))
}

fn read_key(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --api-key-file {}", path.display()))?;
    let key = text.trim().to_string();
    anyhow::ensure!(!key.is_empty(), "--api-key-file {} is empty", path.display());
    Ok(key)
}

fn server_config(args: &ServeArgs) -> Result<ServerConfig> {
    anyhow::ensure!(args.max_tokens > 0, "--max-tokens must be at least 1");
    anyhow::ensure!(args.max_batch > 0, "--max-batch must be at least 1");
    let keep_alive = seconds(args.sse_keep_alive, "sse-keep-alive")?;
    anyhow::ensure!(
        keep_alive >= Duration::from_millis(10),
        "--sse-keep-alive must be at least 0.01 s"
    );
    Ok(ServerConfig {
        limits: Limits {
            max_tokens: args.max_tokens,
            default_completion_tokens: 16,
        },
        max_request_bytes: args.max_request_bytes,
        api_key: args.api_key_file.as_deref().map(read_key).transpose()?,
        keep_alive,
        log_prompts: args.log_prompts,
        spec: args.spec.spec,
        liveness_stall: seconds(args.liveness_stall, "liveness-stall")?,
        prep_workers: args
            .prep_workers
            .unwrap_or_else(deltafin_server::http::prep::default_workers),
        prep_queue: args.prep_queue,
        malformed_calls_as_text: args.malformed_calls_as_text,
    })
}

fn scheduler_config(args: &ServeArgs) -> SchedulerConfig {
    SchedulerConfig {
        max_batch: args.max_batch,
        max_queue: args.max_queue,
        prefill_chunk: args.prefill_chunk.max(1),
        prefill_chunk_solo: args.prefill_chunk_solo.max(1),
        prefill_positions: args.prefill_positions.max(1),
        prefill_step: (args.prefill_step_ms > 0).then(|| Duration::from_millis(args.prefill_step_ms)),
        context_limit: args.context_limit,
        state_cache_entries: args.state_cache,
        state_checkpoints: args.state_checkpoints,
        step_delay: Duration::from_millis(args.step_delay_ms),
        ..SchedulerConfig::default()
    }
}

pub fn serve(args: ServeArgs, cache_dir: &Path) -> Result<()> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .try_init();
    let config = server_config(&args)?;
    let deadline = seconds(args.shutdown_timeout, "shutdown-timeout")?;
    let dir = crate::cli::run::resolve_model(args.model.clone(), cache_dir)?;
    let model_id = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| model::default_model_id(&dir));
    let build = BuildInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        device: deltafin_engine::backend::current().device().to_string(),
        spine: "native".into(),
        exact: true,
    };
    let metrics = Arc::new(Metrics::new(build));
    let state = AppState::new(config, metrics.clone(), Arc::new(ExpertIoStats::default()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr: SocketAddr = format!("{}:{}", args.host, args.port)
            .parse()
            .or_else(|_| format!("[{}]:{}", args.host, args.port).parse())
            .with_context(|| format!("--host {} is not an IP address", args.host))?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!("deltafin: listening on {local}");
        let stream = crate::cli::stream_mode::open(&dir, &args.stream)?;
        let ooc = crate::cli::stream_mode::ooc_options(&dir, &args.ooc, stream.as_ref(), &args.stream)?;
        let loading = tokio::task::spawn_blocking({
            let (state, dir, sched) = (state.clone(), dir.clone(), scheduler_config(&args));
            let drafts = args.spec.sources();
            move || -> Result<()> {
                let started = Instant::now();
                let verify = args.ooc.verify_weights;
                let (loaded, _thread) = model::load(&dir, model_id, sched, ooc.as_ref(), verify, &drafts)?;
                if let Some(rt) = &loaded.ooc {
                    tracing::info!(plan = %crate::cli::ooc_args::describe_plan(&rt.plan, &rt.read), "out-of-core");
                }
                if let Some(memory) = loaded.engine.describe_memory(128 * 1024) {
                    tracing::info!(%memory, "context memory");
                }
                metrics.set_model_load_seconds(started.elapsed().as_secs_f64());
                if let Some(format) = loaded.tool_format {
                    metrics.tool_format(format.label());
                }
                tracing::info!(model = %loaded.model_id, dir = %dir.display(), seconds = started.elapsed().as_secs_f64(), "model loaded; ready");
                state.set_loaded(loaded);
                Ok(())
            }
        });
        let server = shutdown::serve(listener, state, shutdown::signal(), deadline);
        tokio::pin!(server);
        tokio::select! {
            r = &mut server => return r.context("serving"),
            r = loading => r.context("model loading panicked")??,
        }
        server.await.context("serving")
    })
}
