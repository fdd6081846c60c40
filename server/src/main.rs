//! The `deltafin` command.
//!
//! Every flag also reads a `DELTAFIN_<FLAG>` environment variable (clap `env`); this file and
//! the command modules are the only places that read the environment. `--json` prints one JSON
//! object on stdout; logs and tables go to stderr / stdout respectively. Exit code 0 only on
//! success, with a one-line cause on stderr otherwise.

mod bench;
mod bench_disk;
mod ooc_args;
mod run_cmd;
mod synth_cmd;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "deltafin", version, about = "Exact-weights MoE inference for models larger than memory")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One generation.
    Run(run_cmd::RunArgs),
    /// Measurements: disk probes, model decode/prefill under a memory budget.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write a deterministic synthetic checkpoint.
    Synth(synth_cmd::SynthArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Prefill and decode tokens/s, bytes per token by source, hit rate, I/O wait.
    #[command(alias = "model")]
    Run(bench::BenchRunArgs),
    /// Read bandwidth of the model's own expert reads: O_DIRECT, buffered and mmap.
    Disk(bench_disk::BenchDiskArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run_cmd::run(a),
        Command::Bench(BenchCommand::Run(a)) => bench::run(a),
        Command::Bench(BenchCommand::Disk(a)) => bench_disk::run(a),
        Command::Synth(a) => synth_cmd::run(a),
    };
    if let Err(e) = result {
        eprintln!("deltafin: {e:#}");
        std::process::exit(1);
    }
}
