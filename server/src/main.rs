//! The `deltafin` command: parses the command line (every flag also reads a `DELTAFIN_<FLAG>`
//! environment variable; `HF_TOKEN` and `HF_ENDPOINT` are read here too, through clap), resolves
//! process-level settings such as the cache directory and the thread count, and dispatches to a
//! subcommand. Errors print one line on stderr and exit 1;
//! usage errors exit 2.

mod bench;
mod bench_disk;
mod bench_model;
mod bench_serve;
mod bench_spec;
mod doctor;
mod ooc_args;
mod progress;
mod push;
mod run;
mod serve;
mod setup;
mod spec_args;
mod stream_mode;
mod synth_cmd;
mod warm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exact-weights inference for giant mixture-of-experts models.
#[derive(Debug, Parser)]
#[command(name = "deltafin", version, about)]
struct Cli {
    /// Worker threads for the kernels (default: all available cores).
    #[arg(long, global = true, env = "DELTAFIN_THREADS")]
    threads: Option<usize>,
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
    Synth(synth_cmd::SynthArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_threads(cli.threads) {
        eprintln!("error: {e:#}");
        return ExitCode::from(1);
    }
    let cache_dir = cli.cache_dir.unwrap_or_else(default_cache_dir);
    deltafin_fetch::install_tls_provider();
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let result = match cli.command {
        Command::Run(args) => done(run::run(args, &cache_dir)),
        Command::Bench(args) => done(bench::bench(args, &cache_dir)),
        Command::Serve(args) => done(serve::serve(args, &cache_dir)),
        Command::Setup(args) => setup::setup(args),
        Command::SetupQwen(args) => setup::setup_qwen(args),
        Command::Push(args) => push::push(args),
        Command::Doctor(args) => doctor::doctor(args),
        Command::Warm(args) => warm::warm(args),
        Command::Synth(args) => done(synth_cmd::run(args)),
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
