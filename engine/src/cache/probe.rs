//! Disk probes with the engine's own read pattern: whole routed experts at random, read with
//! the reader pool (`O_DIRECT` or buffered, N in flight) or by touching a memory map (page
//! faults, as an mmap-based engine does). `deltafin bench disk` reports them; they are the
//! bandwidth against which `deltafin bench run` measures itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::buffer::AlignedBuf;
use super::read_mode::ReadMode;
use super::reader::{Priority, ReaderConfig, ReaderPool};
use super::spans::{MERGE_GAP, SpanLayout};
use crate::error::Result;
use crate::rng::Rng;
use crate::weights::{TensorInfo, WeightIndex};

/// One probe's result.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    /// `direct`, `buffered` or `mmap`.
    pub method: String,
    pub threads: usize,
    pub reads: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub gib_per_second: f64,
}

/// Read sets of every routed expert, found by tensor name (`…layers.L.mlp.experts.E.…`, or
/// Kimi's `…layers.L.block_sparse_moe.experts.E.…`).
pub fn expert_layouts(index: &WeightIndex) -> Vec<SpanLayout> {
    let mut groups: std::collections::BTreeMap<(usize, usize), Vec<TensorInfo>> = Default::default();
    for name in index.names() {
        let Some((layer, expert)) = parse_expert(name) else {
            continue;
        };
        if let Ok(info) = index.info(name) {
            groups.entry((layer, expert)).or_default().push(info.clone());
        }
    }
    groups.values().map(|t| SpanLayout::new(t, MERGE_GAP)).collect()
}

fn parse_expert(name: &str) -> Option<(usize, usize)> {
    let rest = &name[name.find("layers.")? + 7..];
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))
        .or_else(|| rest.strip_prefix("ffn.experts."))?;
    let (expert, _) = rest.split_once('.')?;
    Some((layer.parse().ok()?, expert.parse().ok()?))
}

/// A random order of `count` distinct layouts starting at `skip` in a seeded permutation
/// (successive probes use disjoint experts so none is served from an earlier probe's cache).
pub fn pick(layouts: usize, skip: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..layouts).collect();
    let mut rng = Rng::new(seed);
    for i in (1..order.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order.into_iter().cycle().skip(skip).take(count).collect()
}

/// Read the chosen layouts with a reader pool of `threads` workers, all in flight.
pub fn read_probe(
    paths: &[PathBuf],
    layouts: &[SpanLayout],
    chosen: &[usize],
    mode: ReadMode,
    threads: usize,
) -> Result<ProbeResult> {
    let config = ReaderConfig {
        mode,
        threads,
        chunk_bytes: 64 << 20,
    };
    let pool = ReaderPool::new(paths, &config)?;
    let (bytes, seconds) = timed_reads(&pool, layouts, chosen, threads)?;
    let method = match (mode, pool.stats().direct_bytes > 0) {
        (ReadMode::Buffered, _) | (_, false) => "buffered",
        _ => "direct",
    };
    Ok(result(method, threads, chosen.len(), bytes, seconds))
}

/// Read the chosen layouts through `pool`, `inflight` at a time; `(bytes, seconds)`.
pub fn timed_reads(
    pool: &ReaderPool,
    layouts: &[SpanLayout],
    chosen: &[usize],
    inflight: usize,
) -> Result<(u64, f64)> {
    let slot = layouts.iter().map(|l| l.total).max().unwrap_or(4096);
    let inflight = inflight.max(1);
    let bufs = (0..inflight)
        .map(|_| AlignedBuf::new(slot).map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let start = Instant::now();
    let mut pending = std::collections::VecDeque::new();
    let mut bytes = 0;
    let wait = |t: super::reader::Ticket| t.wait().map_err(crate::error::Error::from);
    for (i, &l) in chosen.iter().enumerate() {
        if pending.len() == inflight {
            wait(pending.pop_front().expect("non-empty"))?;
        }
        bytes += layouts[l].read_bytes();
        pending.push_back(pool.submit(
            bufs[i % inflight].clone(),
            &layouts[l].segments,
            Priority::Demand,
            None,
        ));
    }
    for t in pending {
        wait(t)?;
    }
    Ok((bytes, start.elapsed().as_secs_f64()))
}

/// Touch one byte per page of the chosen layouts through the index's memory maps, from
/// `threads` threads (what an mmap-based engine's page faults do).
pub fn mmap_probe(
    index: &WeightIndex,
    layouts: &[SpanLayout],
    chosen: &[usize],
    threads: usize,
) -> ProbeResult {
    let start = Instant::now();
    let shards = index.shard_paths().len();
    let infos: Vec<Vec<TensorInfo>> = chosen
        .iter()
        .map(|&l| {
            layouts[l]
                .segments
                .iter()
                .filter(|s| s.shard < shards)
                .map(|s| TensorInfo {
                    name: String::new(),
                    dtype: crate::weights::Dtype::U8,
                    shape: vec![s.len],
                    shard: s.shard,
                    offset: s.offset,
                    len: s.len as u64,
                })
                .collect()
        })
        .collect();
    let bytes: u64 = chosen.iter().map(|&l| layouts[l].read_bytes()).sum();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let sum = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                let mut acc = 0u64;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(group) = infos.get(i) else { break };
                    for info in group {
                        let end = index.file_len(info.shard).min(info.offset + info.len);
                        if end <= info.offset {
                            continue;
                        }
                        let clipped = TensorInfo {
                            len: end - info.offset,
                            ..info.clone()
                        };
                        let blob = index.blob(&clipped);
                        acc += blob.iter().step_by(4096).map(|&b| b as u64).sum::<u64>();
                    }
                }
                sum.fetch_add(acc, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
    std::hint::black_box(sum.into_inner());
    result(
        "mmap",
        threads,
        chosen.len(),
        bytes,
        start.elapsed().as_secs_f64(),
    )
}

/// Ask the kernel to drop the page cache of every shard (`posix_fadvise(DONTNEED)`), so a
/// buffered or mmap probe reads from disk. Best effort.
pub fn evict_page_cache(paths: &[PathBuf]) {
    for p in paths {
        if let Ok(f) = std::fs::File::open(p) {
            super::reader::drop_pages(&f, 0, 0);
        }
    }
}

fn result(method: &str, threads: usize, reads: usize, bytes: u64, seconds: f64) -> ProbeResult {
    let gib_per_second = if seconds > 0.0 {
        bytes as f64 / seconds / (1u64 << 30) as f64
    } else {
        0.0
    };
    ProbeResult {
        method: method.into(),
        threads,
        reads,
        bytes,
        seconds,
        gib_per_second,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_names_parse() {
        assert_eq!(
            parse_expert("model.layers.3.mlp.experts.17.up_proj.weight"),
            Some((3, 17))
        );
        assert_eq!(
            parse_expert("language_model.model.layers.0.mlp.experts.2.down_proj.weight_packed"),
            Some((0, 2))
        );
        assert_eq!(
            parse_expert("model.layers.3.mlp.shared_experts.up_proj.weight"),
            None
        );
        let k3 = "language_model.model.layers.5.block_sparse_moe.experts.895.w2.weight_scale";
        assert_eq!(parse_expert(k3), Some((5, 895)));
        assert_eq!(
            parse_expert("model.layers.5.block_sparse_moe.shared_experts.up_proj.weight"),
            None
        );
        // DeepSeek-V4's published names; its MTP block's experts are not the decoder's.
        assert_eq!(parse_expert("layers.7.ffn.experts.255.w1.scale"), Some((7, 255)));
        assert_eq!(parse_expert("layers.7.ffn.shared_experts.w1.weight"), None);
        assert_eq!(parse_expert("mtp.0.ffn.experts.3.w1.weight"), None);
        let p = pick(10, 0, 4, 1);
        let q = pick(10, 4, 4, 1);
        assert!(p.iter().all(|x| !q.contains(x)), "consecutive picks are disjoint");
    }
}
