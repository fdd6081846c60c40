//! Running a stream install (`deltafin setup --stream`): where its remote experts come from (the
//! source, pinned revision and endpoint recorded in its manifest; token and retry flags here), and
//! the out-of-core options that make the engine fetch each routed expert on first use through the
//! install's store. Stream mode needs the out-of-core loader; route traces do too.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use deltafin_engine::arch;
use deltafin_engine::cache::OocOptions;
use deltafin_fetch::source::hf::DEFAULT_ENDPOINT;
use deltafin_fetch::{EngineSource, SourceSpec};

use crate::cli::ooc_args::OocArgs;
use crate::cli::setup::{Connection, oci_options_of, remote_with, retry_policy_of};

/// How a stream install reaches its source.
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    /// Hugging Face endpoint for a stream install's experts (default: the one it was set up from).
    #[arg(long, env = "HF_ENDPOINT")]
    pub endpoint: Option<String>,
    /// Hugging Face token for private or gated repositories (sent as a Bearer token).
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub hf_token: Option<String>,
    /// Consecutive failures (without progress) before an expert fetch gives up.
    #[arg(long, env = "DELTAFIN_RETRIES", default_value_t = 8)]
    pub retries: u32,
    /// First retry wait in milliseconds (doubles up to 30 s, with jitter).
    #[arg(long, env = "DELTAFIN_RETRY_BASE_MS", default_value_t = 500)]
    pub retry_base_ms: u64,
    /// Expert ranges fetched at once.
    #[arg(long, env = "DELTAFIN_FETCH_WORKERS", default_value_t = 8)]
    pub fetch_workers: usize,
    /// Talk plain HTTP to the OCI registry (always on for 127.0.0.1/localhost).
    #[arg(long, env = "DELTAFIN_PLAIN_HTTP")]
    pub plain_http: bool,
    /// OCI registry user name (with DELTAFIN_OCI_PASSWORD).
    #[arg(long, env = "DELTAFIN_OCI_USERNAME")]
    pub oci_username: Option<String>,
    /// OCI registry password or token.
    #[arg(long, env = "DELTAFIN_OCI_PASSWORD", hide_env_values = true)]
    pub oci_password: Option<String>,
}

/// The store of `dir` when it is a stream install with remote experts left; `None` otherwise
/// (a plain model directory, or a complete install).
pub fn open(dir: &Path, args: &StreamArgs) -> Result<Option<Arc<EngineSource>>> {
    let Some(m) = deltafin_fetch::engine_source::stream_manifest(dir)? else {
        return Ok(None);
    };
    let spec: SourceSpec = format!("{}@{}", m.source, m.pinned)
        .parse()
        .with_context(|| format!("{}: the install manifest's source", dir.display()))?;
    let endpoint = args
        .endpoint
        .clone()
        .or(m.endpoint.clone())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
    let policy = retry_policy_of(args.retries, args.retry_base_ms);
    let conn = Connection {
        endpoint: &endpoint,
        hf_token: args.hf_token.clone(),
        policy,
        oci: oci_options_of(
            args.plain_http,
            args.oci_username.clone(),
            args.oci_password.clone(),
        ),
    };
    let remote = remote_with(&spec, conn)?;
    let source = EngineSource::open(dir, remote, policy)
        .with_context(|| format!("opening the stream install in {}", dir.display()))?;
    Ok(Some(source))
}

/// The out-of-core options for `dir`, or `None` for the in-memory loader. `auto` picks the
/// out-of-core loader when the architecture supports it; a stream install and `--route-trace`
/// require it (and a budget other than `off`).
pub fn ooc_options(
    dir: &Path,
    ooc: &OocArgs,
    stream: Option<&Arc<EngineSource>>,
    args: &StreamArgs,
) -> Result<Option<OocOptions>> {
    let supported = arch::supports_budget(dir)?;
    let need = match (stream.is_some(), ooc.route_trace.is_some()) {
        (true, _) => Some("a stream install fetches its experts through the out-of-core expert cache"),
        (false, true) => Some("--route-trace records the out-of-core expert cache's selections"),
        (false, false) => None,
    };
    let Some(why) = need else {
        // `auto` falls back to the in-memory loader for architectures without out-of-core support.
        let budgeted = ooc.explicit() || supported;
        return Ok(ooc.options()?.filter(|_| budgeted));
    };
    if !supported {
        let hint = if stream.is_some() {
            "; complete it with `deltafin setup --full`"
        } else {
            ""
        };
        bail!(
            "{}: {why}, which this architecture does not support yet{hint}",
            dir.display()
        );
    }
    let Some(mut o) = ooc.options()? else {
        bail!("--memory-budget off cannot be used here: {why}; give a size or `auto`")
    };
    if let Some(s) = stream {
        o.remote = Some(s.remote_weights(args.fetch_workers.max(1)));
    }
    Ok(Some(o))
}
