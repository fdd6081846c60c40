//! `deltafin bench`: measurement programs (kernels and memory bandwidth, serving throughput).

use std::path::Path;

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
    /// Decode tokens/s of the engine loop at 1, 2, 4, 8 concurrent streams.
    Serve(crate::bench_serve::ServeBenchArgs),
}

pub fn bench(args: BenchArgs, cache_dir: &Path) -> Result<()> {
    match args.what {
        BenchWhat::Serve(a) => crate::bench_serve::bench_serve(a, cache_dir),
        BenchWhat::Kernels { json } => {
            let _ = json;
            anyhow::bail!("kernel benchmark not wired yet")
        }
    }
}
