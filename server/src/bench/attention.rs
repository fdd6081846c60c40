//! `deltafin bench attention`: GFLOP/s of the absorbed-MLA attention core
//! (`model::layers::latent_attention::attend`) for a chunk of prompt rows at the end of a long
//! prompt, the shape a prefill chunk deep into a 16k prompt has.
//!
//! The keys and queries are pseudo-random (the kernel's cost does not depend on the values);
//! each row attends causally to every position up to its own, as in prefill. The figure counts
//! the scores (`heads × (latent + rope)` multiply-adds per row and position) and the weighted
//! latents (`heads × latent`), two FLOPs each, over the best of the timed repeats.
//!
//! With `--indexer`, the same chunk under DeepSeek Sparse Attention (GLM-5 / DeepSeek-V3.2):
//! the lightning indexer's scores and top-k per row (`model::layers::dsa`, GLM-5's 32 heads of
//! 128 and top-2048 by default) and the attention over the chosen positions only, beside the
//! dense figure.

use std::time::Instant;

use anyhow::{Result, ensure};
use clap::Args;
use deltafin_engine::model::layers::dsa::{RowQuery, choose};
use deltafin_engine::model::layers::latent_attention::{LatentKeys, LatentQuery, LatentShape, attend};
use deltafin_engine::state::Paged;
use deltafin_engine::synth::Rng;
use serde::Serialize;

/// Arguments of `deltafin bench attention`.
#[derive(Debug, Args)]
pub struct AttentionBenchArgs {
    /// Positions the last row attends to (the prompt's length at the end of the chunk).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,4096,16384",
        env = "DELTAFIN_LENGTHS"
    )]
    lengths: Vec<usize>,
    /// Query rows (the chunk), ending at each length.
    #[arg(long, default_value_t = 256, env = "DELTAFIN_ROWS")]
    rows: usize,
    /// Heads, latent width (`kv_lora_rank`) and rotated width (`qk_rope_head_dim`); the default
    /// is DeepSeek-V3's and K3's (128 heads there; 16 here, as `synth --preset dsv3-bench`).
    #[arg(long, default_value_t = 16, env = "DELTAFIN_HEADS")]
    heads: usize,
    #[arg(long, default_value_t = 512, env = "DELTAFIN_LATENT")]
    latent: usize,
    #[arg(long, default_value_t = 64, env = "DELTAFIN_ROPE")]
    rope: usize,
    /// Also measure DeepSeek Sparse Attention: the indexer (`--index-heads` × `--index-dim`,
    /// top `--index-topk`) and the attention over the chosen positions.
    #[arg(long, env = "DELTAFIN_INDEXER")]
    indexer: bool,
    #[arg(long, default_value_t = 32, env = "DELTAFIN_INDEX_HEADS")]
    index_heads: usize,
    #[arg(long, default_value_t = 128, env = "DELTAFIN_INDEX_DIM")]
    index_dim: usize,
    #[arg(long, default_value_t = 2048, env = "DELTAFIN_INDEX_TOPK")]
    index_topk: usize,
    /// Timed repeats per length (the best is reported).
    #[arg(long, default_value_t = 3, env = "DELTAFIN_REPEATS")]
    repeats: usize,
    /// Print one JSON object instead of a table.
    #[arg(long, env = "DELTAFIN_JSON")]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Figure {
    length: usize,
    rows: usize,
    /// Keys in the cache's blocks, as the engine holds them.
    best_ms: f64,
    gflops: f64,
    /// The same keys in one flat slice: the block layout's cost is `best_ms / flat_ms`.
    flat_ms: f64,
    /// With `--indexer`: the indexer's and the sparse attention's best times.
    #[serde(skip_serializing_if = "Option::is_none")]
    sparse: Option<Sparse>,
}

#[derive(Debug, Serialize)]
struct Sparse {
    indexer_ms: f64,
    indexer_gflops: f64,
    attention_ms: f64,
}

pub fn run(a: AttentionBenchArgs) -> Result<()> {
    ensure!(
        a.rows >= 1 && a.repeats >= 1,
        "--rows and --repeats must be at least 1"
    );
    ensure!(
        a.heads >= 1 && a.latent >= 1,
        "--heads and --latent must be at least 1"
    );
    let s = LatentShape {
        heads: a.heads,
        latent: a.latent,
        rope: a.rope,
        scale: 1.0 / ((a.latent + a.rope) as f32).sqrt(),
    };
    let mut figures = Vec::new();
    for &length in &a.lengths {
        ensure!(length >= a.rows, "a length ({length}) below --rows ({})", a.rows);
        let mut f = measure(s, length, a.rows, a.repeats);
        if a.indexer {
            ensure!(
                a.index_heads >= 1 && a.index_dim >= 1 && a.index_topk >= 1,
                "--index-heads, --index-dim and --index-topk must be at least 1"
            );
            f.sparse = Some(measure_sparse(s, (length, a.rows, a.repeats), &a));
        }
        figures.push(f);
    }
    if a.json {
        println!("{}", serde_json::to_string(&figures)?);
        return Ok(());
    }
    println!(
        "MLA attention, {} heads x ({} latent + {} rope), {} rows ending at each length, {} threads",
        a.heads,
        a.latent,
        a.rope,
        a.rows,
        rayon::current_num_threads()
    );
    if a.indexer {
        println!(
            "DSA: indexer {} heads x {}, top {}; sparse = indexer + attention over the chosen positions",
            a.index_heads, a.index_dim, a.index_topk
        );
        println!(
            "{:>8} {:>10} {:>9} {:>11} {:>9} {:>10} {:>9} {:>8}",
            "length", "dense ms", "GFLOP/s", "indexer ms", "GFLOP/s", "sparse ms", "total ms", "x dense"
        );
        for f in &figures {
            let sp = f.sparse.as_ref().expect("measured with --indexer");
            let total = sp.indexer_ms + sp.attention_ms;
            println!(
                "{:>8} {:>10.1} {:>9.1} {:>11.1} {:>9.1} {:>10.1} {:>9.1} {:>8.2}",
                f.length,
                f.best_ms,
                f.gflops,
                sp.indexer_ms,
                sp.indexer_gflops,
                sp.attention_ms,
                total,
                total / f.best_ms
            );
        }
        return Ok(());
    }
    println!(
        "{:>8} {:>10} {:>9} {:>9} {:>12}",
        "length", "best ms", "GFLOP/s", "flat ms", "blocks/flat"
    );
    for f in &figures {
        println!(
            "{:>8} {:>10.1} {:>9.1} {:>9.1} {:>12.3}",
            f.length,
            f.best_ms,
            f.gflops,
            f.flat_ms,
            f.best_ms / f.flat_ms
        );
    }
    Ok(())
}

/// The chunk under DeepSeek Sparse Attention: each row's index scores and top-k, then the
/// attention over its chosen positions (all of them when its context is within the top-k).
fn measure_sparse(
    s: LatentShape,
    (length, rows, repeats): (usize, usize, usize),
    a: &AttentionBenchArgs,
) -> Sparse {
    let (heads, d, topk) = (a.index_heads, a.index_dim, a.index_topk);
    let mut rng = Rng::new(length as u64 ^ 0xD5A);
    let mut values = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.symmetric(0.5)).collect() };
    let (keys, q, w) = (values(length * d), values(rows * heads * d), values(rows * heads));
    let (latent, rope) = (values(length * s.latent), values(length * s.rope));
    let (q_abs, q_rope) = (values(rows * s.heads * s.latent), values(rows * s.heads * s.rope));
    let len = |r: usize| length - rows + r + 1;
    // As the engine does (`dsa::choose`): the chunk's rows score each tile of keys together.
    let select = || -> Vec<Option<Vec<u32>>> {
        let sparse: Vec<usize> = (0..rows).filter(|&r| len(r) > topk).collect();
        let queries: Vec<RowQuery<'_>> = sparse
            .iter()
            .map(|&r| RowQuery {
                q: &q[r * heads * d..][..heads * d],
                w: &w[r * heads..][..heads],
                len: len(r),
            })
            .collect();
        let mut out: Vec<Option<Vec<u32>>> = vec![None; rows];
        for (&r, c) in sparse.iter().zip(choose(&queries, (&keys).into(), d, topk)) {
            out[r] = Some(c);
        }
        out
    };
    let best = |f: &mut dyn FnMut()| {
        f(); // warm-up
        (0..repeats).fold(f64::INFINITY, |b, _| {
            let t = Instant::now();
            f();
            b.min(t.elapsed().as_secs_f64())
        })
    };
    let mut chosen = Vec::new();
    let indexer = best(&mut || chosen = select());
    let queries: Vec<LatentQuery<'_>> = (0..rows)
        .map(|r| {
            let (keys, n) = match &chosen[r] {
                Some(p) => (LatentKeys::chosen(&latent, &rope, p, s), p.len()),
                None => (LatentKeys::one(&latent, &rope, s), len(r)),
            };
            LatentQuery {
                q_abs: &q_abs[r * s.heads * s.latent..][..s.heads * s.latent],
                q_rope: &q_rope[r * s.heads * s.rope..][..s.heads * s.rope],
                keys,
                len: n,
            }
        })
        .collect();
    let mut out = vec![0.0f32; rows * s.heads * s.latent];
    let attention = best(&mut || attend(&queries, s, &mut out));
    let pairs: f64 = (0..rows).map(|r| len(r) as f64).sum();
    Sparse {
        indexer_ms: indexer * 1e3,
        indexer_gflops: pairs * 2.0 * (heads * d) as f64 / indexer / 1e9,
        attention_ms: attention * 1e3,
    }
}

fn measure(s: LatentShape, length: usize, rows: usize, repeats: usize) -> Figure {
    let mut rng = Rng::new(length as u64);
    let mut values = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.symmetric(0.5)).collect() };
    let (latent, rope) = (values(length * s.latent), values(length * s.rope));
    let (q_abs, q_rope) = (values(rows * s.heads * s.latent), values(rows * s.heads * s.rope));
    let (paged_latent, paged_rope) = (
        Paged::from_rows(&latent, s.latent),
        Paged::from_rows(&rope, s.rope),
    );
    let time = |keys: LatentKeys<'_>| {
        let queries: Vec<LatentQuery<'_>> = (0..rows)
            .map(|r| LatentQuery {
                q_abs: &q_abs[r * s.heads * s.latent..][..s.heads * s.latent],
                q_rope: &q_rope[r * s.heads * s.rope..][..s.heads * s.rope],
                keys,
                len: length - rows + r + 1,
            })
            .collect();
        let mut out = vec![0.0f32; rows * s.heads * s.latent];
        attend(&queries, s, &mut out); // warm-up: pages touched, caches filled
        let mut best = f64::INFINITY;
        for _ in 0..repeats {
            let t = Instant::now();
            attend(&queries, s, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let pairs: f64 = queries.iter().map(|q| q.len as f64).sum();
        (best, pairs)
    };
    // Interleaved, best of each: the two layouts see the same machine.
    let (mut best, mut flat, mut pairs) = (f64::INFINITY, f64::INFINITY, 0.0);
    for _ in 0..2 {
        let (b, p) = time(LatentKeys::one(&paged_latent, &paged_rope, s));
        (best, pairs) = (best.min(b), p);
        flat = flat.min(time(LatentKeys::one(&latent, &rope, s)).0);
    }
    let per_pair = 2.0 * (s.heads * (2 * s.latent + s.rope)) as f64;
    Figure {
        length,
        rows,
        best_ms: best * 1e3,
        gflops: pairs * per_pair / best / 1e9,
        flat_ms: flat * 1e3,
        sparse: None,
    }
}
