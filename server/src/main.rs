//! The `deltafin` command: parses the command line (every flag also reads a `DELTAFIN_<FLAG>`
//! environment variable; `HF_TOKEN` and `HF_ENDPOINT` are read here too, through clap), resolves
//! process-level settings such as the cache directory and the thread count, and dispatches to a
//! subcommand. Errors print one line on stderr and exit 1;
//! usage errors exit 2.

mod bench;
mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::{doctor, plan, push, run, serve, setup, synth, warm};

/// Exact-weights inference for giant mixture-of-experts models.
#[derive(Debug, Parser)]
#[command(name = "deltafin", version, about)]
struct Cli {
    /// Worker threads for the kernels (default: all available cores).
    #[arg(long, global = true, env = "DELTAFIN_THREADS")]
    threads: Option<usize>,
    /// Where matrix products run: `cpu`, `cuda` or `cuda:N` (needs a build with the `cuda`
    /// feature, e.g. the -cuda image). Results are bit-identical on every device.
    #[arg(long, global = true, default_value = "cpu", env = "DELTAFIN_DEVICE")]
    device: deltafin_engine::backend::Device,
    /// Most weight bytes a GPU keeps resident (`40G`, `512M`; default: 90% of its free memory).
    #[arg(long, global = true, value_name = "SIZE", env = "DELTAFIN_DEVICE_MEMORY")]
    device_memory: Option<String>,
    /// Where the built-in default model is generated (default: $XDG_CACHE_HOME/deltafin or
    /// ~/.cache/deltafin).
    #[arg(long, global = true, env = "DELTAFIN_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text for one prompt.
    Run(run::RunArgs),
    /// Measure kernels and memory bandwidth.
    Bench(bench::BenchArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Download a model (Hugging Face or OCI), resumable and verified.
    Setup(setup::SetupArgs),
    /// Add the Qwen raw-completion drafter to an install (DIR/drafts/qwen).
    SetupQwen(setup::SetupQwenArgs),
    /// Push an install to an OCI registry as a model artifact.
    Push(push::PushArgs),
    /// Check an install (read-only) and print a verdict.
    Doctor(doctor::DoctorArgs),
    /// Fetch the routed experts a route trace used most into a stream install.
    Warm(warm::WarmArgs),
    /// Write a deterministic synthetic checkpoint (any size, routing skew and locality knobs).
    Synth(synth::SynthArgs),
    /// What a given box will do with a model: the residency plan for its memory and the
    /// predicted decode and prefill tokens/s, from rates measured here.
    Plan(plan::PlanArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_threads(cli.threads) {
        eprintln!("error: {e:#}");
        return ExitCode::from(1);
    }
    let computes = matches!(
        cli.command,
        Command::Run(_) | Command::Bench(_) | Command::Serve(_)
    );
    if computes && let Err(e) = init_device(cli.device, cli.device_memory.as_deref()) {
        eprintln!("error: {e:#}");
        return ExitCode::from(1);
    }
    let cache_dir = cli.cache_dir.unwrap_or_else(default_cache_dir);
    deltafin_fetch::install_tls_provider();
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Run(args) => done(deltafin_engine::pool::on_pool(|| run::run(args, &cache_dir))),
        Command::Bench(args) => done(bench::bench(args, &cache_dir)),
        Command::Serve(args) => done(serve::serve(args, &cache_dir)),
        Command::Setup(args) => setup::setup(args),
        Command::SetupQwen(args) => setup::setup_qwen(args),
        Command::Push(args) => push::push(args),
        Command::Doctor(args) => doctor::doctor(args, cli.device),
        Command::Warm(args) => warm::warm(args),
        Command::Synth(args) => done(synth::run(args)),
        Command::Plan(args) => done(plan::run(args, &cache_dir)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init_threads(threads: Option<usize>) -> anyhow::Result<()> {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    anyhow::ensure!(n > 0, "--threads must be at least 1");
    rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
    Ok(())
}

/// Open the compute device and make it the process's backend (the CPU needs nothing).
fn init_device(device: deltafin_engine::backend::Device, memory: Option<&str>) -> anyhow::Result<()> {
    use deltafin_engine::backend::{self, Backend, Device};
    if device == Device::Cpu {
        anyhow::ensure!(
            memory.is_none(),
            "--device-memory applies to a GPU (--device cuda)"
        );
        return Ok(());
    }
    let memory = memory
        .map(deltafin_engine::cache::plan::parse_size)
        .transpose()
        .map_err(|e| anyhow::Error::new(e).context("--device-memory"))?;
    let b = Backend::open(device, memory)?;
    eprintln!("deltafin: matrix products on {}", b.describe());
    backend::install(b).map_err(|_| anyhow::anyhow!("a compute backend was already installed"))?;
    Ok(())
}

/// `$XDG_CACHE_HOME/deltafin`, else `$HOME/.cache/deltafin`, else `./.deltafin-cache`.
fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("deltafin");
    }
    match std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache").join("deltafin"),
        None => PathBuf::from(".deltafin-cache"),
    }
}
