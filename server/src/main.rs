//! The `deltafin` command: parses the command line (every flag also reads a `DELTAFIN_<FLAG>`
//! environment variable), resolves process-level settings such as the cache directory and the
//! thread count, and dispatches to a subcommand. Errors print one line on stderr and exit 1;
//! usage errors exit 2.

mod bench;
mod bench_disk;
mod bench_model;
mod bench_serve;
mod ooc_args;
mod run;
mod serve;
mod synth_cmd;

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
    let result = match cli.command {
        Command::Run(args) => run::run(args, &cache_dir),
        Command::Bench(args) => bench::bench(args, &cache_dir),
        Command::Serve(args) => serve::serve(args, &cache_dir),
        Command::Synth(args) => synth_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
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
