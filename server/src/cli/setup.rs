//! `deltafin setup` and `deltafin setup-qwen`: turn the command line into `deltafin_fetch`
//! installs. The main model goes into `--dir`; drafts (`--draft NAME=SOURCE`, `--include-qwen`) go
//! into `DIR/drafts/NAME/`, each a complete install with its own manifest. Progress goes to a
//! terminal bar or plain lines, and to `--progress-file` as JSON lines (the operator's contract);
//! `--json` prints one summary object on stdout.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{ArgGroup, Args};
use deltafin_fetch::error::human_bytes;
use deltafin_fetch::progress::{Fanout, JsonLinesFile, ProgressSink};
use deltafin_fetch::report::{KubeTarget, StatusReporter};
use deltafin_fetch::retry::RetryPolicy;
use deltafin_fetch::source::hf::HfRepo;
use deltafin_fetch::source::oci::{OciOptions, OciSource};
use deltafin_fetch::{InstallOptions, InstallReport, Mode, Remote, SourceSpec};
use oci_auth::registry_auth;
use serde_json::json;

use crate::cli::progress::{NotFinal, human_sink};

/// The default Qwen drafter (`--include-qwen`, `setup-qwen`).
pub const DEFAULT_QWEN: &str = "hf://Qwen/Qwen3-0.6B-Base";

/// Network and transfer settings shared by the setup commands.
#[derive(Debug, Args)]
pub struct NetArgs {
    /// Hugging Face endpoint (a mirror, or a local server in tests).
    #[arg(long, env = "HF_ENDPOINT", default_value = deltafin_fetch::source::hf::DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Hugging Face token for private or gated repositories (sent as a Bearer token).
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub hf_token: Option<String>,
    /// Parallel range requests.
    #[arg(long, env = "DELTAFIN_WORKERS", default_value_t = 8)]
    pub workers: usize,
    /// Largest range per request, in MiB.
    #[arg(long, env = "DELTAFIN_CHUNK_MIB", default_value_t = 64)]
    pub chunk_mib: u64,
    /// Free space to keep beyond the download, in MiB.
    #[arg(long, env = "DELTAFIN_HEADROOM_MIB", default_value_t = 1024)]
    pub headroom_mib: u64,
    /// Consecutive failures (without progress) before a transfer gives up.
    #[arg(long, env = "DELTAFIN_RETRIES", default_value_t = 8)]
    pub retries: u32,
    /// First retry wait in milliseconds (doubles up to 30 s, with jitter).
    #[arg(long, env = "DELTAFIN_RETRY_BASE_MS", default_value_t = 500)]
    pub retry_base_ms: u64,
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

/// `deltafin setup`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").required(true).args(["full", "stream"])))]
pub struct SetupArgs {
    /// `hf://ORG/REPO[@REVISION]` or `oci://REGISTRY/REPO:TAG`.
    #[arg(long, env = "DELTAFIN_SOURCE")]
    pub source: String,
    /// Install directory (created if missing).
    #[arg(long, env = "DELTAFIN_DIR")]
    pub dir: PathBuf,
    /// Download every file (completes a streamed install without re-downloading).
    #[arg(long, env = "DELTAFIN_FULL")]
    pub full: bool,
    /// Download every non-expert byte; routed experts are fetched on first use.
    #[arg(long, env = "DELTAFIN_STREAM")]
    pub stream: bool,
    /// A draft model, `NAME=SOURCE`, installed in full under DIR/drafts/NAME (repeatable).
    #[arg(long = "draft", value_name = "NAME=SOURCE")]
    pub drafts: Vec<String>,
    /// Also install the Qwen drafter (see --qwen-source) under DIR/drafts/qwen.
    #[arg(long, env = "DELTAFIN_INCLUDE_QWEN")]
    pub include_qwen: bool,
    /// Source of the Qwen drafter.
    #[arg(long, env = "DELTAFIN_QWEN_SOURCE", default_value = DEFAULT_QWEN)]
    pub qwen_source: String,
    /// Append JSON-lines progress records to this file.
    #[arg(long, env = "DELTAFIN_PROGRESS_FILE")]
    pub progress_file: Option<PathBuf>,
    /// Print one JSON summary object on stdout.
    #[arg(long, env = "DELTAFIN_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub report: ReportArgs,
    #[command(flatten)]
    pub net: NetArgs,
}

/// Progress reports to a DeltafinModel's status (the operator's setup Job sets these).
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Also report progress to `status.setupProgress` of the DeltafinModel `NAMESPACE/NAME` on
    /// the Kubernetes API (in-cluster: the pod's ServiceAccount token and CA).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub report_status: Option<String>,
    /// The setup Job name written with each report.
    #[arg(long, requires = "report_status", default_value = "")]
    pub report_job: String,
    /// Kubernetes API server URL (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT).
    #[arg(long, env = "DELTAFIN_KUBE_API")]
    pub kube_api: Option<String>,
    #[arg(long, env = "KUBERNETES_SERVICE_HOST", hide = true)]
    pub kube_host: Option<String>,
    #[arg(long, env = "KUBERNETES_SERVICE_PORT", hide = true)]
    pub kube_port: Option<String>,
    /// Bearer token file for the reports.
    #[arg(long, default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token")]
    pub kube_token_file: PathBuf,
    /// CA bundle of the API server.
    #[arg(long, default_value = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")]
    pub kube_ca_file: PathBuf,
    /// Least time between two download reports, in seconds (phase changes go at once).
    #[arg(long, default_value_t = 2.0)]
    pub report_interval_s: f64,
}

/// `deltafin setup-qwen`.
#[derive(Debug, Args)]
pub struct SetupQwenArgs {
    /// Install directory of the main model.
    #[arg(long, env = "DELTAFIN_DIR")]
    pub dir: PathBuf,
    /// Source of the Qwen drafter.
    #[arg(long, env = "DELTAFIN_QWEN_SOURCE", default_value = DEFAULT_QWEN)]
    pub source: String,
    /// Append JSON-lines progress records to this file.
    #[arg(long, env = "DELTAFIN_PROGRESS_FILE")]
    pub progress_file: Option<PathBuf>,
    /// Print one JSON summary object on stdout.
    #[arg(long, env = "DELTAFIN_JSON")]
    pub json: bool,
    #[command(flatten)]
    pub net: NetArgs,
}

/// One install to perform.
struct Job {
    label: String,
    spec: SourceSpec,
    dir: PathBuf,
    mode: Mode,
}

/// `deltafin setup`.
pub fn setup(args: SetupArgs) -> anyhow::Result<ExitCode> {
    let spec: SourceSpec = args.source.parse()?;
    let mode = if args.stream { Mode::Stream } else { Mode::Full };
    let mut jobs = vec![Job {
        label: "model".into(),
        spec,
        dir: args.dir.clone(),
        mode,
    }];
    let mut drafts: Vec<(String, String)> = args
        .drafts
        .iter()
        .map(|d| parse_draft(d))
        .collect::<anyhow::Result<_>>()?;
    if args.include_qwen && !drafts.iter().any(|(n, _)| n == "qwen") {
        drafts.push(("qwen".into(), args.qwen_source.clone()));
    }
    for (name, source) in drafts {
        let spec = source.parse().with_context(|| format!("draft `{name}`"))?;
        jobs.push(Job {
            label: format!("draft {name}"),
            spec,
            dir: draft_dir(&args.dir, &name),
            mode: Mode::Full,
        });
    }
    let reporter = status_reporter(&args.report)?;
    let reporter = reporter.map(std::sync::Arc::new);
    let res = run_jobs(
        &jobs,
        &args.net,
        args.progress_file.as_deref(),
        args.json,
        reporter.as_ref(),
    );
    if let Some(r) = reporter {
        let s = r.finish();
        if s.failed > 0 {
            eprintln!(
                "warning: {} of {} status reports failed (last: {})",
                s.failed,
                s.sent + s.failed,
                s.last_error.unwrap_or_default()
            );
        }
    }
    res
}

/// The status reporter `--report-status` asks for.
fn status_reporter(a: &ReportArgs) -> anyhow::Result<Option<StatusReporter>> {
    let Some(target) = &a.report_status else {
        return Ok(None);
    };
    let Some((namespace, name)) = target
        .split_once('/')
        .filter(|(n, m)| !n.is_empty() && !m.is_empty())
    else {
        bail!("--report-status `{target}`: expected NAMESPACE/NAME");
    };
    let api = match (&a.kube_api, &a.kube_host, &a.kube_port) {
        (Some(api), _, _) => api.clone(),
        (None, Some(h), Some(p)) if h.contains(':') => format!("https://[{h}]:{p}"),
        (None, Some(h), Some(p)) => format!("https://{h}:{p}"),
        _ => bail!(
            "--report-status needs the API server: --kube-api, or KUBERNETES_SERVICE_HOST and \
             KUBERNETES_SERVICE_PORT (set in every pod)"
        ),
    };
    if !(a.report_interval_s.is_finite() && a.report_interval_s >= 0.0) {
        bail!("--report-interval-s must be a number of seconds >= 0");
    }
    let target = KubeTarget {
        api,
        token_file: a.kube_token_file.clone(),
        ca_file: Some(a.kube_ca_file.clone()),
        namespace: namespace.into(),
        name: name.into(),
        job: a.report_job.clone(),
    };
    let warn = Box::new(|m: &str| eprintln!("warning: {m}"));
    let interval = Duration::from_secs_f64(a.report_interval_s);
    Ok(Some(StatusReporter::start(target, interval, warn)?))
}

/// `deltafin setup-qwen`.
pub fn setup_qwen(args: SetupQwenArgs) -> anyhow::Result<ExitCode> {
    let spec: SourceSpec = args.source.parse()?;
    let jobs = [Job {
        label: "draft qwen".into(),
        spec,
        dir: draft_dir(&args.dir, "qwen"),
        mode: Mode::Full,
    }];
    run_jobs(&jobs, &args.net, args.progress_file.as_deref(), args.json, None)
}

/// `NAME=SOURCE` with a plain NAME.
fn parse_draft(s: &str) -> anyhow::Result<(String, String)> {
    let Some((name, source)) = s.split_once('=') else {
        bail!("--draft `{s}`: expected NAME=SOURCE")
    };
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        || name.starts_with('.')
    {
        bail!("--draft `{s}`: NAME must be letters, digits, `-`, `_` or `.`");
    }
    Ok((name.to_string(), source.to_string()))
}

/// Where a draft named `name` of the install in `dir` lives.
pub fn draft_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join("drafts").join(name)
}

fn run_jobs(
    jobs: &[Job],
    net: &NetArgs,
    progress_file: Option<&Path>,
    json: bool,
    reporter: Option<&std::sync::Arc<StatusReporter>>,
) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let file_sink = progress_file
        .map(JsonLinesFile::create)
        .transpose()?
        .map(std::sync::Arc::new);
    let mut reports = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let mut sinks: Vec<Box<dyn ProgressSink>> = vec![human_sink(&job.label)];
        if let Some(f) = &file_sink {
            sinks.push(Box::new(Shared(f.clone())));
        }
        if let Some(r) = reporter {
            sinks.push(Box::new(Shared(r.clone())));
        }
        let fan = Fanout(sinks);
        let last = i + 1 == jobs.len();
        let sink: &dyn ProgressSink = &fan;
        let not_final = NotFinal(sink);
        let sink: &dyn ProgressSink = if last { sink } else { &not_final };
        let remote = remote_for(&job.spec, net)?;
        let opts = install_options(&job.dir, job.mode, net);
        let report = rt
            .block_on(deltafin_fetch::install(&remote, &opts, sink))
            .with_context(|| format!("{} ({})", job.label, job.spec.id()))?;
        if !json {
            eprintln!("{}", summary_line(&job.label, &report));
        }
        if report.complete && report.mode == Mode::Full && !checksums_current(&job.dir) {
            let line = super::doctor::record_checksums(&job.dir)
                .with_context(|| format!("{}: recording checksums", job.label))?;
            if !json {
                eprintln!("{line}");
            }
        }
        reports.push((job.label.clone(), report));
    }
    if json {
        let out: serde_json::Map<String, serde_json::Value> = reports
            .iter()
            .map(|(l, r)| (l.clone(), serde_json::to_value(r).expect("json")))
            .collect();
        println!("{}", json!(out));
    }
    Ok(ExitCode::SUCCESS)
}

/// A sink shared by every job's [`Fanout`] (the progress file, the status reporter).
struct Shared<T>(std::sync::Arc<T>);

impl<T: ProgressSink> ProgressSink for Shared<T> {
    fn event(&self, e: &deltafin_fetch::progress::ProgressEvent) {
        self.0.event(e);
    }
}

/// Build the source client for `spec`.
pub fn remote_for(spec: &SourceSpec, net: &NetArgs) -> anyhow::Result<Remote> {
    let conn = Connection {
        endpoint: &net.endpoint,
        hf_token: net.hf_token.clone(),
        policy: retry_policy(net),
        oci: oci_options(net),
    };
    remote_with(spec, conn)
}

/// How to reach a source.
pub struct Connection<'a> {
    pub endpoint: &'a str,
    pub hf_token: Option<String>,
    pub policy: RetryPolicy,
    pub oci: OciOptions,
}

/// Build the source client for `spec` from explicit connection settings.
pub fn remote_with(spec: &SourceSpec, conn: Connection<'_>) -> anyhow::Result<Remote> {
    Ok(match spec {
        SourceSpec::Hf { .. } => {
            let client = deltafin_fetch::http::build_client(&Default::default())?;
            Remote::Hf(HfRepo::new(
                client,
                conn.endpoint,
                spec,
                conn.hf_token,
                conn.policy,
            )?)
        }
        SourceSpec::Oci { .. } => Remote::Oci(OciSource::new(spec, &conn.oci)?),
    })
}

/// OCI connection options from the flags.
pub fn oci_options(net: &NetArgs) -> OciOptions {
    oci_options_of(net.plain_http, net.oci_username.clone(), net.oci_password.clone())
}

/// OCI connection options: plain HTTP or not, basic auth when a user name is given.
pub fn oci_options_of(plain_http: bool, user: Option<String>, password: Option<String>) -> OciOptions {
    OciOptions {
        plain_http,
        auth: registry_auth(user, password),
    }
}

fn retry_policy(net: &NetArgs) -> RetryPolicy {
    retry_policy_of(net.retries, net.retry_base_ms)
}

/// At most `retries` consecutive failures, backing off from `base_ms` up to 30 s.
pub fn retry_policy_of(retries: u32, base_ms: u64) -> RetryPolicy {
    RetryPolicy {
        max_attempts: retries.max(1),
        base: Duration::from_millis(base_ms),
        cap: Duration::from_secs(30),
    }
}

fn install_options(dir: &Path, mode: Mode, net: &NetArgs) -> InstallOptions {
    InstallOptions {
        workers: net.workers.max(1),
        chunk_size: net.chunk_mib.max(1) << 20,
        headroom: net.headroom_mib << 20,
        retry: retry_policy(net),
        ..InstallOptions::new(dir, mode)
    }
}

fn summary_line(label: &str, r: &InstallReport) -> String {
    let rate = if r.download_seconds > 0.0 {
        r.bytes_downloaded as f64 / r.download_seconds
    } else {
        0.0
    };
    format!(
        "{label}: {} @ {} {:?}{}: {}/{} files published, {} local of {}, {} downloaded in {:.1} s ({}/s), verification {:.1} s",
        r.source,
        r.pinned,
        r.mode,
        if r.complete { "" } else { " (incomplete)" },
        r.files_published,
        r.files_total,
        human_bytes(r.bytes_local),
        human_bytes(r.bytes_total),
        human_bytes(r.bytes_downloaded),
        r.download_seconds,
        human_bytes(rate as u64),
        r.verify_seconds,
    )
}

mod oci_auth {
    use deltafin_fetch::source::oci::RegistryAuth;

    /// Basic auth when a user name is given, anonymous otherwise.
    pub fn registry_auth(user: Option<String>, password: Option<String>) -> RegistryAuth {
        match user {
            Some(u) => RegistryAuth::Basic(u, password.unwrap_or_default()),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// Whether `dir` has checksums recorded for its shards as they are (a repeated `setup` of a
/// complete install does not re-hash it).
fn checksums_current(dir: &Path) -> bool {
    use deltafin_engine::weights::{Checksums, WeightIndex};
    let Ok(Some(sums)) = Checksums::load(dir) else {
        return false;
    };
    WeightIndex::open(dir).is_ok_and(|ix| sums.for_index(&ix).is_ok())
}
