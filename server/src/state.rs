//! Shared server state: configuration, metrics, the loaded model (set once loading finishes,
//! which is what `/readyz` reports) and the draining flag of a graceful shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deltafin_engine::cache::OocRuntime;
use deltafin_engine::cache::shard::ShardWatch;
use deltafin_engine::constrain::Vocabulary;
use deltafin_engine::scheduler::{ExpertIoStats, SchedulerHandle};
use deltafin_engine::tokenizer::Tokenizer;
use deltafin_engine::tools::{ToolFormat, ToolMarkers};

use crate::http::error::ApiError;
use crate::http::openai::reasoning::Markers;
use crate::http::openai::request::Limits;
use crate::http::prep::PrepPool;
use crate::metrics::Metrics;

/// Process-level server settings (built from the command line in `main`).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Request bounds applied during validation.
    pub limits: Limits,
    /// Largest accepted request body (413 above).
    pub max_request_bytes: usize,
    /// Bearer key required on `/v1/*` (`None`: no authentication).
    pub api_key: Option<String>,
    /// Interval of SSE keep-alive comments while a stream has nothing to send.
    pub keep_alive: Duration,
    /// Log prompt text (off by default: prompts never reach the log).
    pub log_prompts: bool,
    /// Whether requests draft (speculative decoding never changes their tokens).
    pub spec: deltafin_engine::spec::SpecMode,
    /// `/livez` fails once the engine loop has made no progress for this long with requests
    /// in flight (or its thread has ended), so the kubelet restarts the pod.
    pub liveness_stall: Duration,
    /// Threads preparing requests at once (render, tokenize, compile grammars), and requests
    /// that may wait for one before 429 ([`crate::http::prep`]).
    pub prep_workers: usize,
    pub prep_queue: usize,
    /// A malformed tool call comes back as `content` text with its markers removed (off: it
    /// is dropped; counted either way).
    pub malformed_calls_as_text: bool,
}

impl Default for ServerConfig {
    /// The `deltafin serve` defaults (no API key).
    fn default() -> Self {
        ServerConfig {
            limits: Limits {
                max_tokens: 1_000_000,
                default_completion_tokens: 16,
            },
            max_request_bytes: 32 << 20,
            api_key: None,
            keep_alive: Duration::from_secs(15),
            log_prompts: false,
            spec: deltafin_engine::spec::SpecMode::Auto,
            liveness_stall: Duration::from_secs(120),
            prep_workers: crate::http::prep::default_workers(),
            prep_queue: crate::http::prep::DEFAULT_QUEUE,
            malformed_calls_as_text: false,
        }
    }
}

/// Everything a request needs once the model is loaded.
#[derive(Debug)]
pub struct Loaded {
    pub tokenizer: Arc<Tokenizer>,
    pub engine: SchedulerHandle,
    /// The served model id (`GET /v1/models`; a request's `model` must match).
    pub model_id: String,
    /// Unix time the model finished loading.
    pub created: u64,
    /// Ids that end any generation (EOS).
    pub stop_ids: Vec<u32>,
    /// Extra ids that end a chat turn (`<|im_end|>` and the like).
    pub chat_stop_ids: Vec<u32>,
    /// How the chat format marks thinking, if it does.
    pub markers: Option<Markers>,
    /// The out-of-core machinery when loaded under a memory budget (expert-read metrics).
    pub ooc: Option<Arc<OocRuntime>>,
    /// In memory: the memory-mapped shard files, watched for changes under the process.
    pub watch: Option<ShardWatch>,
    /// The model's native tool-call format, if its tokenizer has one.
    pub tool_format: Option<ToolFormat>,
    /// That format's marker ids.
    pub tool_markers: Option<ToolMarkers>,
    /// Logit rows per token (the model's vocabulary, possibly padded past the tokenizer's).
    pub vocab_size: usize,
    /// The vocabulary indexed for constrained decoding, built on first use.
    pub vocabulary: OnceLock<Arc<Vocabulary>>,
}

impl Loaded {
    /// Whether the weights can be read as published now: out of core, the reader pool's
    /// [`deltafin_engine::cache::ReaderPool::health`]; in memory, every memory-mapped shard
    /// still whole (a request never faults on the pages of a truncated file). Cheap when
    /// nothing failed: one `fstat` per shard.
    pub fn weights_health(&self) -> Result<(), ApiError> {
        let health = match (&self.ooc, &self.watch) {
            (Some(rt), _) => rt.health(),
            (None, Some(watch)) => watch.check(),
            (None, None) => Ok(()),
        };
        health.map_err(|e| ApiError::WeightsUnavailable(e.to_string()))
    }

    /// The constrained-decoding vocabulary (indexed once, on the first request that needs it).
    pub fn vocabulary(&self) -> Result<Arc<Vocabulary>, ApiError> {
        if let Some(v) = self.vocabulary.get() {
            return Ok(v.clone());
        }
        let structural: Vec<u32> = self
            .tool_markers
            .as_ref()
            .map(|m| m.structural_ids())
            .unwrap_or_default();
        let v = Vocabulary::new(self.tokenizer.clone(), self.vocab_size, &structural).map_err(|e| {
            tracing::error!(error = %e, "constrained decoding is unavailable");
            ApiError::Internal("constrained decoding is unavailable for this tokenizer")
        })?;
        Ok(self.vocabulary.get_or_init(|| Arc::new(v)).clone())
    }
}

#[derive(Debug)]
struct Shared {
    config: ServerConfig,
    metrics: Arc<Metrics>,
    expert_io: Arc<ExpertIoStats>,
    loaded: OnceLock<Arc<Loaded>>,
    draining: AtomicBool,
    prep: PrepPool,
}

/// The state every handler receives. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(config: ServerConfig, metrics: Arc<Metrics>, expert_io: Arc<ExpertIoStats>) -> Self {
        AppState(Arc::new(Shared {
            metrics,
            expert_io,
            loaded: OnceLock::new(),
            draining: AtomicBool::new(false),
            prep: PrepPool::new(config.prep_workers, config.prep_queue),
            config,
        }))
    }

    /// Run a request's blocking preparation (parse, render, tokenize, compile) on the bounded
    /// pool ([`PrepPool::run`]): 429 when it is full.
    pub async fn prepare<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        self.0.prep.run(f).await
    }

    pub fn config(&self) -> &ServerConfig {
        &self.0.config
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.0.metrics
    }

    pub fn expert_io(&self) -> &ExpertIoStats {
        &self.0.expert_io
    }

    /// Publish the loaded model (readiness turns true). Later calls are ignored.
    pub fn set_loaded(&self, loaded: Loaded) {
        let _ = self.0.loaded.set(Arc::new(loaded));
    }

    /// The loaded model, or why requests cannot run now.
    pub fn loaded(&self) -> Result<Arc<Loaded>, ApiError> {
        if self.0.draining.load(Ordering::SeqCst) {
            return Err(ApiError::ShuttingDown);
        }
        self.0.loaded.get().cloned().ok_or(ApiError::Loading)
    }

    /// The loaded model even while draining (metrics, shutdown).
    pub fn loaded_any(&self) -> Option<Arc<Loaded>> {
        self.0.loaded.get().cloned()
    }

    /// Ready: loaded and not shutting down. Busy does not make a server unready.
    pub fn ready(&self) -> bool {
        self.loaded().is_ok()
    }

    /// Start a graceful shutdown: readiness goes false, new requests get 503.
    pub fn begin_drain(&self) {
        self.0.draining.store(true, Ordering::SeqCst);
    }
}
