//! `deltafin bench attention`: GFLOP/s of the absorbed-MLA attention core
//! (`model::layers::latent_attention::attend`) for a chunk of prompt rows at the end of a long
//! prompt, the shape a prefill chunk deep into a 16k prompt has.
//!
//! The keys and queries are pseudo-random (the kernel's cost does not depend on the values);
//! each row attends causally to every position up to its own, as in prefill. The figure counts
//! the scores (`heads × (latent + rope)` multiply-adds per row and position) and the weighted
//! latents (`heads × latent`), two FLOPs each, over the best of the timed repeats.

use std::time::Instant;

use anyhow::{Result, ensure};
use clap::Args;
use deltafin_engine::model::layers::latent_attention::{LatentKeys, LatentQuery, LatentShape, attend};
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
    best_ms: f64,
    gflops: f64,
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
        figures.push(measure(s, length, a.rows, a.repeats));
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
    println!("{:>8} {:>10} {:>9}", "length", "best ms", "GFLOP/s");
    for f in &figures {
        println!("{:>8} {:>10.1} {:>9.1}", f.length, f.best_ms, f.gflops);
    }
    Ok(())
}

fn measure(s: LatentShape, length: usize, rows: usize, repeats: usize) -> Figure {
    let mut rng = Rng::new(length as u64);
    let mut values = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.symmetric(0.5)).collect() };
    let (latent, rope) = (values(length * s.latent), values(length * s.rope));
    let (q_abs, q_rope) = (values(rows * s.heads * s.latent), values(rows * s.heads * s.rope));
    let keys = LatentKeys::one(&latent, &rope, s);
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
    let per_pair = 2.0 * (s.heads * (2 * s.latent + s.rope)) as f64;
    Figure {
        length,
        rows,
        best_ms: best * 1e3,
        gflops: pairs * per_pair / best / 1e9,
    }
}
