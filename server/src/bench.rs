//! `deltafin bench`: measurement programs (kernels and memory bandwidth).

use anyhow::Result;
use clap::{Args, Subcommand};

/// Arguments of `deltafin bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Debug, Subcommand)]
enum BenchWhat {
    /// Effective GB/s of each format's matrix-vector kernel and the multi-row kernel, beside a
    /// measured memory-bandwidth probe.
    Kernels {
        /// Print one JSON object instead of a table.
        #[arg(long, env = "DELTAFIN_JSON")]
        json: bool,
    },
}

pub fn bench(args: BenchArgs) -> Result<()> {
    match args.what {
        BenchWhat::Kernels { json } => {
            let _ = json;
            anyhow::bail!("kernel benchmark not wired yet")
        }
    }
}
