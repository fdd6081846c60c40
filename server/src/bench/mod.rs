//! `deltafin bench`: measurement programs (kernels and memory bandwidth, serving throughput, a
//! model under a memory budget, the disk with the engine's read pattern).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use deltafin_engine::backend::bench::{self as kernel_bench, BenchFormat, BenchOptions};
use deltafin_engine::pool::on_pool;

mod attention;
mod compress;
mod disk;
mod grammar;
mod model;
mod prefill;
pub(crate) mod serve;
mod spec;

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
        /// Formats to measure (comma-separated: f32, bf16, fp8, int4, mxfp4; default all).
        #[arg(long, value_delimiter = ',', env = "DELTAFIN_FORMATS")]
        formats: Vec<String>,
        /// Minimum measuring time per point, in milliseconds.
        #[arg(long, default_value_t = 500, env = "DELTAFIN_MIN_TIME_MS")]
        min_time_ms: u64,
        /// Bytes of the memory-bandwidth probe buffer (far larger than the L3 cache).
        #[arg(long, default_value_t = 512 << 20, env = "DELTAFIN_PROBE_BYTES")]
        probe_bytes: usize,
        /// Measure the kernels' compute ceiling instead: per format two N x 2048 matrices that
        /// fill three quarters of the threads' L2 caches, so no figure is limited by memory and
        /// each call is long enough that the hand-off to the threads costs a few per cent. Read
        /// its GB/s against the probe: below 1.0 of it, the format's decode and arithmetic
        /// cannot keep up with memory on this CPU.
        #[arg(long, env = "DELTAFIN_CACHE_HOT")]
        cache_hot: bool,
        /// Input-row counts of the multi-row calls, each timed against one row (prefill-sized
        /// counts such as 128 or 1024 also print the tiled product's GFLOP/s).
        #[arg(long, value_delimiter = ',', default_value = "2,4,8", env = "DELTAFIN_ROWS")]
        rows: Vec<usize>,
    },
    /// Decode tokens/s of the engine loop at 1, 2, 4, 8 concurrent streams.
    Serve(self::serve::ServeBenchArgs),
    /// A model under a memory budget: prefill/decode tokens/s, bytes per token by source, hit
    /// rate, read bandwidth, compute vs I/O wait, ratio to the I/O bound.
    #[command(alias = "model")]
    Run(self::model::BenchRunArgs),
    /// Prefill tokens/s at 1k, 4k and 16k prompt tokens (in memory or under a budget), beside
    /// the prefill I/O bound.
    Prefill(self::prefill::BenchPrefillArgs),
    /// Read bandwidth of the model's own expert reads: O_DIRECT, buffered and mmap.
    Disk(self::disk::BenchDiskArgs),
    /// Speculative decoding per proposer at controlled acceptance rates: tokens/s against
    /// target-only, with the economics gate and with drafting forced on.
    Spec(self::spec::SpecBenchArgs),
    /// GFLOP/s of the MLA attention core for a prefill chunk ending at 1k, 4k and 16k tokens.
    Attention(self::attention::AttentionBenchArgs),
    /// Constrained decoding on a 163,840-id vocabulary: mask time per token for a JSON schema
    /// and a forced tool call, beside the decode time of a model pass.
    Grammar(self::grammar::GrammarBenchArgs),
    /// Lossless compression of the stored weights, measured before it is built: per format the
    /// zstd ratio and single-core decode GB/s (16-bit floats also split into byte planes), and
    /// the I/O bound it would give against today's.
    Compress(self::compress::CompressBenchArgs),
}

pub fn bench(args: BenchArgs, cache_dir: &Path) -> Result<()> {
    match args.what {
        BenchWhat::Serve(a) => self::serve::bench_serve(a, cache_dir),
        // The benchmarks that run passes on this thread run on a pool worker, so the passes'
        // parallel loops start there (`pool::on_pool`), as in `run` and the server. Not `serve`,
        // whose own engine thread does that per pass while this thread waits on it (with one
        // worker, waiting there would leave the engine no worker).
        BenchWhat::Run(a) => on_pool(|| self::model::run(a, cache_dir)),
        BenchWhat::Prefill(a) => on_pool(|| self::prefill::run(a, cache_dir)),
        BenchWhat::Disk(a) => self::disk::run(a),
        BenchWhat::Compress(a) => self::compress::run(a),
        BenchWhat::Spec(a) => on_pool(|| self::spec::run(a, cache_dir)),
        BenchWhat::Grammar(a) => self::grammar::run(a, cache_dir),
        BenchWhat::Attention(a) => on_pool(|| self::attention::run(a)),
        BenchWhat::Kernels {
            json,
            formats,
            min_time_ms,
            probe_bytes,
            cache_hot,
            rows,
        } => {
            let mut opts = BenchOptions {
                threads: rayon::current_num_threads(),
                min_time: Duration::from_millis(min_time_ms),
                probe_bytes,
                // `--device cuda` benchmarks the GPU's products.
                backend: deltafin_engine::backend::current().device()
                    != deltafin_engine::backend::Device::Cpu,
                batch_rows: rows.into_iter().filter(|&n| n > 0).collect(),
                cache_hot,
                ..BenchOptions::default()
            };
            if !formats.is_empty() {
                opts.formats = formats
                    .iter()
                    .map(|f| BenchFormat::parse(f).ok_or_else(|| anyhow::anyhow!("unknown format `{f}`")))
                    .collect::<Result<_>>()?;
            }
            let report = kernel_bench::run(&opts);
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{report}");
            }
            Ok(())
        }
    }
}
