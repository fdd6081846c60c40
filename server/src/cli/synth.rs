//! `deltafin synth`: write a synthetic checkpoint in a real on-disk format: DeepSeek-V3
//! architecture (BF16, block-FP8 or INT4 experts), Kimi K3 (MXFP4 experts at the latent
//! width, BF16 spine, KDA + gated MLA, Block AttnRes), gpt-oss (stacked MXFP4 experts) or
//! MiniMax-M2 (block FP8).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use deltafin_engine::cache::plan::human;
use deltafin_engine::synth::{
    DeepseekSynth, DeepseekV4Synth, ExpertFormat, GqaMoeSynth, KimiK3Synth, RoutingModel, RoutingShape,
};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    Bf16,
    Fp8,
    Int4,
}

/// Shape presets.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Preset {
    /// A small synthetic DeepSeek-V3-architecture model (~12 MB, 16 BF16 experts, top-4,
    /// group-limited routing).
    Builtin,
    /// A ~12.5 GB DeepSeek-V3-architecture model (16 layers, 64 experts of 12 MiB, top-8),
    /// the shape of the llama.cpp peer baseline.
    Dsv3Bench,
    /// The built-in K3 preset (`--model builtin:k3`): Kimi K3 architecture, ~20 MB, MXFP4
    /// experts.
    K3Builtin,
    /// A ~4.4 GB Kimi K3-architecture model: hidden 2048, 16 layers (KDA, gated MLA every 4th
    /// layer, AttnRes blocks of 4), 128 MXFP4 experts of 1.6 MiB at latent width 1024, top-8,
    /// 2 shared experts; spine : routed bytes per token ≈ 6 (real K3 ≈ 4.2).
    K3Bench,
    /// gpt-oss-120b's shapes in its published layout (hidden 2880, 128 stacked MXFP4 experts of
    /// width 2880, top-4, sinks, sliding/full layers), 2 layers unless `--layers`/`--size`.
    #[value(name = "gpt-oss-120b")]
    GptOss120b,
    /// MiniMax-M2's shapes in its published block-FP8 layout (hidden 3072, 256 experts of width
    /// 1536, top-8, whole-projection q/k norms), 1 layer unless `--layers`/`--size`.
    MinimaxM2,
    /// Qwen3.5-397B-A17B's shapes in its published block-FP8 layout (hidden 4096, 3 gated-DeltaNet
    /// layers to 1 gated-attention layer, 512 experts of width 1024, top-10, a gated shared
    /// expert), 4 layers (~26 GB) unless `--layers`/`--experts`/`--size`.
    #[value(name = "qwen3.5-397b")]
    Qwen35_397b,
    /// GLM-5's shapes in its block-FP8 layout (`glm_moe_dsa`: hidden 6144, MLA with 64 heads,
    /// DeepSeek Sparse Attention with a 32-head indexer choosing 2048 positions, 256 experts of
    /// width 2048, top-8, a shared expert), a dense layer and a MoE layer (~10 GB) unless
    /// `--layers`/`--experts`/`--size`.
    Glm5,
    /// DeepSeek-V4-Flash's shapes in its published layout (`deepseek_v4`: hidden 4096, 64 heads
    /// of 512 with one K=V head, sliding / compressed sparse (ratio 4, the 64 × 128 indexer
    /// keeping 512) / heavily compressed (ratio 128) attention, mHC with 4 streams, 256 FP4
    /// experts of width 2048, top-6, 3 hash-routed layers, block FP8 with UE8M0 scales), 4
    /// layers (~13 GB) unless `--layers`/`--experts`/`--size`.
    #[value(name = "dsv4-flash")]
    Dsv4Flash,
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output directory (created).
    #[arg(long, env = "DELTAFIN_OUT")]
    pub out: PathBuf,
    #[arg(long, value_enum, default_value = "dsv3-bench")]
    pub preset: Preset,
    /// Expert format of the DeepSeek-V3 and GLM-5 presets (default: BF16; GLM-5: FP8; K3 experts
    /// are always MXFP4).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Override the number of decoder layers (scales the size).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the routed experts per MoE layer.
    #[arg(long)]
    pub experts: Option<usize>,
    /// Override the context length (`max_position_embeddings`; e.g. 32768 for 16k prompts).
    #[arg(long)]
    pub max_position: Option<usize>,
    /// dsv4-flash and glm5: the published attention state per position and per sequence
    /// (V4-Flash: head, indexer-key and rope widths, window, ratios, top-k, layer schedule;
    /// GLM-5: MLA latent, rope key, indexer key, top-k) with little compute (hidden 256, 2
    /// heads, 8 narrow experts), to measure context memory at long lengths.
    #[arg(long)]
    pub narrow: bool,
    /// Grow the layer count until the checkpoint reaches about this size (e.g. `30G`).
    #[arg(long)]
    pub size: Option<String>,
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Routing model of the DeepSeek-V3 and GLM-5 presets: `uniform` (independent, balanced
    /// routes) or `published` (temporal reuse and per-layer skew calibrated to the published
    /// measurements; see `engine/src/synth/routing.rs`). Without it: skew 0, locality 0.
    #[arg(long, value_parser = parse_routing)]
    pub routing: Option<RoutingModel>,
    /// Per-expert selection-bias spread (0 = balanced routing); overrides `--routing`'s.
    #[arg(long)]
    pub route_skew: Option<f32>,
    /// 0 = routes follow the token, 1 = routes follow the context (more reuse); overrides
    /// `--routing`'s.
    #[arg(long)]
    pub route_locality: Option<f32>,
    #[arg(long, default_value_t = 0x5EED)]
    pub seed: u64,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// A routing model's name, for clap.
pub fn parse_routing(name: &str) -> Result<RoutingModel, String> {
    RoutingModel::parse(name).ok_or_else(|| {
        let names: Vec<&str> = RoutingModel::ALL.iter().map(|m| m.name()).collect();
        format!("unknown routing model {name:?} (one of: {})", names.join(", "))
    })
}

/// The router knobs: the `--routing` model's (skew 0 and locality 0 without one), then the
/// explicit overrides.
fn routing_shape(a: &SynthArgs) -> RoutingShape {
    let mut shape = a.routing.map_or(
        RoutingShape {
            skew: 0.0,
            locality: 0.0,
            layer_spread: 0.0,
        },
        RoutingModel::shape,
    );
    if let Some(s) = a.route_skew {
        shape.skew = s;
    }
    if let Some(l) = a.route_locality {
        shape.locality = l;
    }
    shape
}

/// Whether any routing knob was given (they shape the DeepSeek-V3 router only).
fn routing_given(a: &SynthArgs) -> bool {
    a.routing.is_some() || a.route_skew.is_some() || a.route_locality.is_some()
}

/// The one-based MLA layers of a K3-style schedule: every 4th layer and the last (K3: 4, 8,
/// …, 92 and 93).
fn k3_full_attn_layers(layers: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (4..=layers).step_by(4).collect();
    if v.last() != Some(&layers) {
        v.push(layers);
    }
    v
}

fn k3_preset(p: Preset) -> Option<KimiK3Synth> {
    match p {
        Preset::K3Builtin => Some(KimiK3Synth::k3_builtin()),
        Preset::K3Bench => Some(KimiK3Synth {
            hidden: 2048,
            intermediate: 8192,
            moe_intermediate: 1024,
            latent: 1024,
            layers: 16,
            full_attn_layers: k3_full_attn_layers(16),
            heads: 16,
            q_lora: Some(512),
            kv_lora: 256,
            nope: 64,
            rope: 32,
            v: 64,
            kda_heads: 16,
            kda_head_dim: 128,
            experts: 128,
            top_k: 8,
            shared: 2,
            block_size: 4,
            max_position: 4096,
            ..KimiK3Synth::k3_builtin()
        }),
        Preset::Builtin
        | Preset::Dsv3Bench
        | Preset::GptOss120b
        | Preset::MinimaxM2
        | Preset::Qwen35_397b
        | Preset::Glm5
        | Preset::Dsv4Flash => None,
    }
}

fn gqa_preset(p: Preset) -> Option<GqaMoeSynth> {
    match p {
        Preset::GptOss120b => Some(GqaMoeSynth::gpt_oss_120b(2)),
        Preset::MinimaxM2 => Some(GqaMoeSynth::minimax_m2(1)),
        Preset::Qwen35_397b => Some(GqaMoeSynth::qwen35_397b(4)),
        _ => None,
    }
}

fn preset(p: Preset) -> DeepseekSynth {
    match p {
        Preset::Builtin
        | Preset::K3Builtin
        | Preset::K3Bench
        | Preset::GptOss120b
        | Preset::MinimaxM2
        | Preset::Qwen35_397b
        | Preset::Dsv4Flash => DeepseekSynth::builtin(),
        Preset::Glm5 => DeepseekSynth::glm5(2, ExpertFormat::Fp8),
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
    if a.narrow && !matches!(a.preset, Preset::Dsv4Flash | Preset::Glm5) {
        bail!("--narrow applies to the dsv4-flash and glm5 presets only");
    }
    if let Some(k3) = k3_preset(a.preset) {
        return run_k3(k3, &a);
    }
    if let Some(g) = gqa_preset(a.preset) {
        return run_gqa(g, &a);
    }
    if matches!(a.preset, Preset::Dsv4Flash) {
        return run_v4(DeepseekV4Synth::flash(4), &a);
    }
    let mut s = preset(a.preset);
    if a.narrow {
        s = s.narrow();
    }
    s.format = match a.format {
        None => s.format,
        Some(Format::Bf16) => ExpertFormat::Bf16,
        Some(Format::Fp8) => ExpertFormat::Fp8,
        Some(Format::Int4) => ExpertFormat::Int4,
    };
    s.shards = a.shards.max(1);
    s.seed = a.seed;
    s.routing = routing_shape(&a);
    if let Some(l) = a.layers {
        s.layers = l.max(s.first_dense + 1);
    }
    if let Some(e) = a.experts {
        s.experts = e;
    }
    if let Some(m) = a.max_position {
        s.max_position = m.max(1);
    }
    if let Some(want) = wanted_size(&a)? {
        while s.data_bytes() < want {
            s.layers += 1;
        }
    }
    let shape = Shape {
        layers: s.layers,
        experts: s.experts,
        top_k: s.top_k,
        expert_bytes: s.expert_bytes(),
    };
    write_and_report(&a, |dir| s.write(dir), s.data_bytes(), shape)
}

/// `--size` in bytes, checked.
fn wanted_size(a: &SynthArgs) -> Result<Option<u64>> {
    let Some(size) = &a.size else { return Ok(None) };
    let want = deltafin_engine::cache::plan::parse_size(size)?;
    if !(1 << 20..=200 << 30).contains(&want) {
        bail!("--size {size}: choose between 1M and 200G");
    }
    Ok(Some(want))
}

fn run_v4(mut s: DeepseekV4Synth, a: &SynthArgs) -> Result<()> {
    if a.format.is_some() || routing_given(a) {
        bail!(
            "--format and the routing options do not apply to dsv4-flash (its experts are FP4, as published)"
        );
    }
    if a.narrow {
        s = s.narrow();
    }
    s.shards = a.shards.max(1);
    s.seed = a.seed;
    if let Some(l) = a.layers {
        s.layers = l.max(1);
    }
    if let Some(e) = a.experts {
        s.experts = e.max(s.top_k);
    }
    if let Some(m) = a.max_position {
        s.max_position = m.max(1);
    }
    if let Some(want) = wanted_size(a)? {
        while s.data_bytes() < want {
            s.layers += 1;
        }
    }
    let shape = Shape {
        layers: s.layers,
        experts: s.experts,
        top_k: s.top_k,
        expert_bytes: s.expert_bytes(),
    };
    write_and_report(a, |dir| s.write(dir), s.data_bytes(), shape)
}

/// Write the checkpoint with `write` into `--out` and report it.
fn write_and_report(
    a: &SynthArgs,
    write: impl FnOnce(&std::path::Path) -> deltafin_engine::Result<()>,
    bytes: u64,
    shape: Shape,
) -> Result<()> {
    let start = Instant::now();
    write(&a.out).with_context(|| format!("writing {}", a.out.display()))?;
    report(a, bytes, start.elapsed().as_secs_f64(), shape);
    Ok(())
}

fn run_k3(mut s: KimiK3Synth, a: &SynthArgs) -> Result<()> {
    if a.format.is_some_and(|f| !matches!(f, Format::Bf16)) || routing_given(a) {
        bail!(
            "--format, --routing, --route-skew and --route-locality apply to the DeepSeek-V3 presets only (K3 experts are MXFP4)"
        );
    }
    s.shards = a.shards.max(1);
    s.seed = a.seed;
    if let Some(m) = a.max_position {
        s.max_position = m.max(1);
    }
    let relayer = |s: &mut KimiK3Synth, layers: usize| {
        s.layers = layers.max(s.first_dense + 1);
        s.full_attn_layers = k3_full_attn_layers(s.layers);
    };
    if let Some(l) = a.layers {
        relayer(&mut s, l);
    }
    if let Some(e) = a.experts {
        s.experts = e.max(s.top_k);
    }
    if let Some(want) = wanted_size(a)? {
        while s.data_bytes() < want {
            let next = s.layers + 1;
            relayer(&mut s, next);
        }
    }
    let shape = Shape {
        layers: s.layers,
        experts: s.experts,
        top_k: s.top_k,
        expert_bytes: s.expert_bytes(),
    };
    write_and_report(a, |dir| s.write(dir), s.data_bytes(), shape)
}

fn run_gqa(mut s: GqaMoeSynth, a: &SynthArgs) -> Result<()> {
    if a.format.is_some() || routing_given(a) {
        bail!("--format, --routing, --route-skew and --route-locality apply to the DeepSeek-V3 presets only");
    }
    s.shards = a.shards.max(1);
    s.seed = a.seed;
    if let Some(m) = a.max_position {
        s.max_position = m.max(1);
    }
    if let Some(l) = a.layers {
        s.layers = l.max(1);
    }
    if let Some(e) = a.experts {
        s.experts = e.max(s.top_k);
    }
    if let Some(want) = wanted_size(a)? {
        while s.data_bytes() < want {
            s.layers += 1;
        }
    }
    let shape = Shape {
        layers: s.layers,
        experts: s.experts,
        top_k: s.top_k,
        expert_bytes: s.expert_bytes(),
    };
    write_and_report(a, |dir| s.write(dir), s.data_bytes(), shape)
}

struct Shape {
    layers: usize,
    experts: usize,
    top_k: usize,
    expert_bytes: u64,
}

fn report(a: &SynthArgs, bytes: u64, secs: f64, s: Shape) {
    let gib_s = bytes as f64 / secs / (1u64 << 30) as f64;
    if a.json {
        let shape = routing_shape(a);
        let summary = serde_json::json!({
            "out": a.out, "preset": format!("{:?}", a.preset), "bytes": bytes, "seconds": secs, "gib_per_second": gib_s,
            "layers": s.layers, "experts": s.experts, "top_k": s.top_k, "expert_bytes": s.expert_bytes,
            "routing": a.routing.map(RoutingModel::name), "route_skew": shape.skew,
            "route_locality": shape.locality, "route_layer_spread": shape.layer_spread,
        });
        println!("{summary}");
    } else {
        eprintln!(
            "wrote {} ({}) in {secs:.1} s ({gib_s:.2} GiB/s): {} layers, {} experts of {} each, top-{}",
            a.out.display(),
            human(bytes),
            s.layers,
            s.experts,
            human(s.expert_bytes),
            s.top_k
        );
    }
}
