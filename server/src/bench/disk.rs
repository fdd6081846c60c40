//! `deltafin bench disk`: read bandwidth of whole-expert random reads from the model's own
//! shards, with the reader pool (`O_DIRECT` and buffered, several reads in flight) and through
//! mmap page faults. Each probe reads experts no earlier probe touched, and the shards' page
//! cache is dropped before buffered and mmap probes.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use deltafin_engine::cache::ReadMode;
use deltafin_engine::cache::probe::{
    ProbeResult, evict_page_cache, expert_layouts, mmap_probe, pick, read_probe,
};
use deltafin_engine::weights::WeightIndex;

#[derive(Debug, Args)]
pub struct BenchDiskArgs {
    #[arg(long, env = "DELTAFIN_MODEL")]
    pub model: PathBuf,
    /// Experts read per probe.
    #[arg(long, default_value_t = 96)]
    pub reads: usize,
    /// Reads in flight to try (comma-separated).
    #[arg(long, default_value = "1,4,8", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Skip the mmap probe.
    #[arg(long)]
    pub no_mmap: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: BenchDiskArgs) -> Result<()> {
    let index = WeightIndex::open(&a.model)?;
    let layouts = expert_layouts(&index);
    if layouts.is_empty() {
        bail!("{}: no routed experts found", a.model.display());
    }
    let paths = index.shard_paths();
    let expert_bytes = layouts.iter().map(|l| l.read_bytes()).max().unwrap_or(0);
    let mut results: Vec<ProbeResult> = Vec::new();
    let mut skip = 0;
    let mut next = |n: usize| {
        let p = pick(layouts.len(), skip, n, 0xD15C);
        skip += n;
        p
    };
    for &t in &a.threads {
        results.push(read_probe(&paths, &layouts, &next(a.reads), ReadMode::Direct, t)?);
        evict_page_cache(&paths);
        results.push(read_probe(
            &paths,
            &layouts,
            &next(a.reads),
            ReadMode::Buffered,
            t,
        )?);
    }
    if !a.no_mmap {
        for &t in &[1, 2] {
            evict_page_cache(&paths);
            results.push(mmap_probe(&index, &layouts, &next(a.reads), t));
        }
    }
    evict_page_cache(&paths);
    let best = |m: &str| {
        results
            .iter()
            .filter(|r| r.method == m)
            .map(|r| r.gib_per_second)
            .fold(0.0, f64::max)
    };
    let summary = serde_json::json!({
        "model": a.model, "expert_bytes": expert_bytes, "experts": layouts.len(),
        "best_direct_gib_s": best("direct"), "best_buffered_gib_s": best("buffered"), "best_mmap_gib_s": best("mmap"),
        "probes": results,
    });
    if a.json {
        println!("{summary}");
        return Ok(());
    }
    println!(
        "expert reads of {:.2} MiB from {} ({} experts)",
        expert_bytes as f64 / (1 << 20) as f64,
        a.model.display(),
        layouts.len()
    );
    println!(
        "{:<10} {:>8} {:>7} {:>10} {:>9}",
        "method", "inflight", "reads", "GiB", "GiB/s"
    );
    for r in &results {
        println!(
            "{:<10} {:>8} {:>7} {:>10.2} {:>9.2}",
            r.method,
            r.threads,
            r.reads,
            r.bytes as f64 / (1u64 << 30) as f64,
            r.gib_per_second
        );
    }
    Ok(())
}
