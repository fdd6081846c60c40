//! `deltafin-operator`: `run` the controller, or print the `crd`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use deltafin_operator::cache;
use deltafin_operator::controller::{self, Context};
use deltafin_operator::metrics::Metrics;
use deltafin_operator::model::Settings;
use deltafin_operator::requests::CountRequests;
use deltafin_operator::version;
use deltafin_operator::web::{self, WebState};
use tracing::{info, warn};

/// Kubernetes operator for Deltafin models.
#[derive(Debug, Parser)]
#[command(name = "deltafin-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Reconcile DeltafinModel resources until SIGTERM.
    Run(RunArgs),
    /// Print the DeltafinModel CustomResourceDefinition as YAML.
    Crd {
        /// Leave out the CEL rules (for Kubernetes before 1.25, which does not run them).
        #[arg(long)]
        without_cel: bool,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Address of /metrics, /livez and /readyz.
    #[arg(long, env = "DELTAFIN_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Watch one namespace only (default: all namespaces).
    #[arg(long, env = "DELTAFIN_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Server image for `device.type: Cpu` when `spec.image` is unset.
    #[arg(long, env = "DELTAFIN_DEFAULT_IMAGE")]
    default_image: Option<String>,
    /// Server image for `device.type: Cuda` when `spec.image` is unset.
    #[arg(long, env = "DELTAFIN_DEFAULT_CUDA_IMAGE")]
    default_cuda_image: Option<String>,
    /// Log filter (tracing-subscriber syntax).
    #[arg(long, env = "DELTAFIN_LOG", default_value = "info,kube=warn")]
    log: String,
    /// Name of this pod, used as the reporting instance of events.
    #[arg(long, env = "DELTAFIN_POD_NAME")]
    pod_name: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { without_cel: false } => {
            print!("{}", deltafin_operator::crd::crd_yaml()?);
            Ok(())
        }
        Command::Crd { without_cel: true } => {
            print!("{}", deltafin_operator::crd::crd_yaml_without_cel()?);
            Ok(())
        }
        Command::Run(args) => run(args).await,
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&args.log).context("--log")?)
        .with_writer(std::io::stderr)
        .init();
    let metrics = Arc::new(Metrics::default());
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration (in-cluster or kubeconfig)")?;
    // Every request is counted (deltafin_operator_api_requests_total{verb,resource}).
    let client = kube::client::ClientBuilder::try_from(config)
        .context("cannot build the Kubernetes client")?
        .with_layer(&CountRequests::new(metrics.clone()))
        .build();
    let info = client
        .apiserver_version()
        .await
        .context("cannot read the server's /version")?;
    let caps = version::capabilities(version::KubeVersion::from_info(&info)?)?;
    controller::check_crd(&client, args.watch_namespace.as_deref()).await.context(
        "cannot list DeltafinModels: install the CRD (`deltafin-operator crd | kubectl apply --server-side -f -`) \
         and grant the operator list access",
    )?;
    let mut settings = Settings::with_version(env!("CARGO_PKG_VERSION"));
    if let Some(i) = args.default_image {
        settings.default_image = i;
    }
    if let Some(i) = args.default_cuda_image {
        settings.default_cuda_image = i;
    }
    settings.service_monitors = controller::service_monitors_served(&client).await;
    settings.served = caps.served;
    let notice = caps.notice();
    info!(kubernetes = %info.git_version, ?settings, "starting");
    if let Some(n) = &notice {
        warn!("{n}");
    }
    let ready = Arc::new(AtomicBool::new(false));
    let (stores, writers) = cache::stores(settings.service_monitors);
    let ctx =
        Arc::new(Context::new(client, settings, metrics.clone(), args.pod_name, stores).with_notice(notice));
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_addr))?;
    let app = web::router(WebState {
        metrics,
        ready: ready.clone(),
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown_signal());
    let (_, served) = tokio::join!(controller::run(ctx, writers, args.watch_namespace, ready), server);
    if let Err(e) = served {
        warn!(error = %e, "metrics server stopped with an error");
    }
    info!("stopped");
    Ok(())
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
