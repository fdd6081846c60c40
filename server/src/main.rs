//! The `deltafin` command: parses the command line (every flag also reads a `DELTAFIN_<FLAG>`
//! environment variable; `HF_TOKEN` and `HF_ENDPOINT` are read here too, through clap) and
//! dispatches to a subcommand. Errors print one line on stderr and exit 1; usage errors exit 2.

mod doctor;
mod progress;
mod push;
mod setup;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exact-weights inference for giant mixture-of-experts models.
#[derive(Debug, Parser)]
#[command(name = "deltafin", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Download a model (Hugging Face or OCI), resumable and verified.
    Setup(setup::SetupArgs),
    /// Add the Qwen raw-completion drafter to an install (DIR/drafts/qwen).
    SetupQwen(setup::SetupQwenArgs),
    /// Push an install to an OCI registry as a model artifact.
    Push(push::PushArgs),
    /// Check an install (read-only) and print a verdict.
    Doctor(doctor::DoctorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    deltafin_fetch::install_tls_provider();
    let result = match cli.command {
        Command::Setup(args) => setup::setup(args),
        Command::SetupQwen(args) => setup::setup_qwen(args),
        Command::Push(args) => push::push(args),
        Command::Doctor(args) => doctor::doctor(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
