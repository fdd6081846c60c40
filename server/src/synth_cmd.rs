//! `deltafin synth`: write a synthetic DeepSeek-V3-architecture checkpoint.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use deltafin_engine::cache::plan::human;
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat, RoutingShape};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    Bf16,
    Fp8,
    Int4,
}

/// Shape presets.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Preset {
    /// The built-in default model (~20 MB).
    Builtin,
    /// A ~12.5 GB DeepSeek-V3-architecture model (16 layers, 64 experts of 12 MiB, top-8),
    /// the shape of the llama.cpp peer baseline.
    Dsv3Bench,
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output directory (created).
    #[arg(long, env = "DELTAFIN_OUT")]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value = "dsv3-bench")]
    pub preset: Preset,
    #[arg(long, value_enum, default_value = "bf16")]
    pub format: Format,
    /// Override the number of decoder layers (scales the size).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the routed experts per MoE layer.
    #[arg(long)]
    pub experts: Option<usize>,
    /// Grow the layer count until the checkpoint reaches about this size (e.g. `30G`).
    #[arg(long)]
    pub size: Option<String>,
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Per-expert selection-bias spread (0 = balanced routing).
    #[arg(long, default_value_t = 0.0)]
    pub route_skew: f32,
    /// 0 = routes follow the token, 1 = routes follow the context (more reuse).
    #[arg(long, default_value_t = 0.0)]
    pub route_locality: f32,
    #[arg(long, default_value_t = 0x5EED)]
    pub seed: u64,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

fn preset(p: Preset) -> DeepseekSynth {
    match p {
        Preset::Builtin => DeepseekSynth::builtin(),
        Preset::Dsv3Bench => DeepseekSynth {
            hidden: 2048,
            intermediate: 4096,
            moe_intermediate: 1024,
            layers: 16,
            heads: 16,
            q_lora: Some(512),
            kv_lora: 256,
            nope: 64,
            rope: 32,
            v: 64,
            experts: 64,
            top_k: 8,
            n_group: 1,
            topk_group: 1,
            first_dense: 1,
            max_position: 4096,
            ..DeepseekSynth::builtin()
        },
    }
}

pub fn run(a: SynthArgs) -> Result<()> {
    let mut s = preset(a.preset);
    s.format = match a.format {
        Format::Bf16 => ExpertFormat::Bf16,
        Format::Fp8 => ExpertFormat::Fp8,
        Format::Int4 => ExpertFormat::Int4,
    };
    s.shards = a.shards.max(1);
    s.seed = a.seed;
    s.routing = RoutingShape { skew: a.route_skew, locality: a.route_locality };
    if let Some(l) = a.layers {
        s.layers = l.max(s.first_dense + 1);
    }
    if let Some(e) = a.experts {
        s.experts = e;
    }
    if let Some(size) = &a.size {
        let want = deltafin_engine::cache::plan::parse_size(size).map_err(anyhow::Error::msg)?;
        if !(1 << 20..=200 << 30).contains(&want) {
            bail!("--size {size}: choose between 1M and 200G");
        }
        while s.data_bytes() < want {
            s.layers += 1;
        }
    }
    let start = Instant::now();
    s.write(&a.out).with_context(|| format!("writing {}", a.out.display()))?;
    let secs = start.elapsed().as_secs_f64();
    let bytes = s.data_bytes();
    let summary = serde_json::json!({
        "out": a.out, "bytes": bytes, "seconds": secs, "gib_per_second": bytes as f64 / secs / (1u64 << 30) as f64,
        "layers": s.layers, "experts": s.experts, "top_k": s.top_k, "expert_bytes": s.expert_bytes(),
        "route_skew": a.route_skew, "route_locality": a.route_locality,
    });
    if a.json {
        println!("{summary}");
    } else {
        eprintln!(
            "wrote {} ({}) in {secs:.1} s ({:.2} GiB/s): {} layers, {} experts of {} each, top-{}",
            a.out.display(),
            human(bytes),
            bytes as f64 / secs / (1u64 << 30) as f64,
            s.layers,
            s.experts,
            human(s.expert_bytes()),
            s.top_k
        );
    }
    Ok(())
}
