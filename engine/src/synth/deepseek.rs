//! Synthetic DeepSeek-V3-architecture checkpoints (BF16 spine; BF16, block-FP8 or INT4 experts).
//!
//! Tensor data is generated in fixed blocks of [`BLOCK`] elements, each from its own generator
//! keyed by (seed, tensor name, block number), several blocks at a time on all cores, so any
//! size writes at close to disk speed and the bytes never depend on the thread count.
//!
//! Routing shape ([`RoutingShape`]): `skew` adds a per-expert offset drawn from N(0, skew²) to
//! each MoE layer's `e_score_correction_bias` (selection only, like DeepSeek's balancing bias,
//! so some experts win more often); `locality` sets the RMS of token embeddings to
//! `8^(1 - 2·locality)` relative to the O(1) outputs of the attention and FFN blocks. A large
//! embedding (locality 0) makes each token's own identity decide its routes (random tokens route
//! independently), a small one (locality 1) lets the slowly-changing attention context decide
//! (consecutive tokens share experts). `docs/performance.md` lists the measured reuse and load
//! skew for the settings used by the benchmark.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use rayon::prelude::*;

use super::{Rng, write_byte_tokenizer};
use crate::error::{Error, Result};
use crate::weights::{Dtype, TensorSpec, write_atomic, write_safetensors};

/// How routed experts (and, for FP8, every other Linear) are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertFormat {
    Bf16,
    /// DeepSeek block FP8 on every Linear (128x128 blocks), like DeepSeek-V3 / Kimi-K2-Instruct.
    Fp8,
    /// compressed-tensors INT4 (group 32) on routed experts, like Kimi-K2-Thinking.
    Int4,
}

/// Shape and format of a synthetic DeepSeek-V3 checkpoint.
#[derive(Debug, Clone)]
pub struct DeepseekSynth {
    pub hidden: usize,
    pub intermediate: usize,
    pub moe_intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub q_lora: Option<usize>,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub first_dense: usize,
    pub max_position: usize,
    pub format: ExpertFormat,
    /// Number of safetensors shards (an index is written when > 1).
    pub shards: usize,
    pub seed: u64,
    pub routing: RoutingShape,
}

/// Knobs shaping how the synthetic router behaves (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingShape {
    /// Standard deviation of per-expert selection-bias offsets (0: balanced).
    pub skew: f32,
    /// 0: routes follow the token; 1: routes follow the context (more token-to-token reuse).
    pub locality: f32,
}

impl Default for RoutingShape {
    fn default() -> Self {
        RoutingShape { skew: 0.0, locality: 0.5 }
    }
}

/// Elements generated per independent block.
pub const BLOCK: usize = 1 << 20;

impl DeepseekSynth {
    /// The built-in default model.
    pub fn builtin() -> Self {
        DeepseekSynth {
            hidden: 256,
            intermediate: 512,
            moe_intermediate: 128,
            layers: 4,
            heads: 4,
            q_lora: Some(128),
            kv_lora: 64,
            nope: 32,
            rope: 16,
            v: 32,
            experts: 16,
            top_k: 4,
            n_group: 4,
            topk_group: 2,
            first_dense: 1,
            max_position: 4096,
            format: ExpertFormat::Bf16,
            shards: 1,
            seed: 0x5EED,
            routing: RoutingShape::default(),
        }
    }

    /// A tiny model for tests (fast to write and run).
    pub fn tiny(format: ExpertFormat) -> Self {
        DeepseekSynth {
            hidden: 64,
            intermediate: 96,
            moe_intermediate: 32,
            layers: 3,
            heads: 2,
            q_lora: Some(48),
            kv_lora: 32,
            nope: 16,
            rope: 8,
            v: 16,
            experts: 8,
            top_k: 2,
            n_group: 2,
            topk_group: 1,
            first_dense: 1,
            max_position: 1024,
            format,
            shards: 2,
            seed: 7,
            routing: RoutingShape::default(),
        }
    }

    fn vocab(&self) -> usize {
        512
    }

    /// The `config.json` contents.
    pub fn config(&self) -> Value {
        let mut c = json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": self.vocab(),
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "moe_intermediate_size": self.moe_intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "q_lora_rank": self.q_lora,
            "kv_lora_rank": self.kv_lora,
            "qk_nope_head_dim": self.nope,
            "qk_rope_head_dim": self.rope,
            "v_head_dim": self.v,
            "n_routed_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "n_shared_experts": 1,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "norm_topk_prob": true,
            "routed_scaling_factor": 2.5,
            "first_k_dense_replace": self.first_dense,
            "hidden_act": "silu",
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "max_position_embeddings": self.max_position,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                "mscale_all_dim": 1.0, "original_max_position_embeddings": self.max_position / 4},
            "tie_word_embeddings": false,
            "bos_token_id": 256,
            "eos_token_id": 257,
            "torch_dtype": "bfloat16",
            "deltafin_synthetic": true,
        });
        match self.format {
            ExpertFormat::Bf16 => {}
            ExpertFormat::Fp8 => {
                c["quantization_config"] =
                    json!({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]});
            }
            ExpertFormat::Int4 => {
                c["quantization_config"] = json!({
                    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "weights": {
                        "num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
                        "dynamic": false, "observer": "minmax", "actorder": null}}},
                    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
                });
            }
        }
        c
    }

    /// Every tensor, in file order, with how to fill it.
    fn tensors(&self) -> Vec<(TensorSpec, Fill)> {
        let mut t = Vec::new();
        let (h, v) = (self.hidden, self.vocab());
        let embed_rms = 8f32.powf(1.0 - 2.0 * self.routing.locality.clamp(0.0, 1.0));
        t.push(dense("model.embed_tokens.weight", v, h, embed_rms * (h as f32).sqrt()));
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            t.push(norm(&format!("{p}.input_layernorm.weight"), h));
            t.push(norm(&format!("{p}.post_attention_layernorm.weight"), h));
            let qk = self.nope + self.rope;
            match self.q_lora {
                Some(r) => {
                    self.linear(&mut t, &format!("{p}.self_attn.q_a_proj"), r, h, false);
                    t.push(norm(&format!("{p}.self_attn.q_a_layernorm.weight"), r));
                    self.linear(&mut t, &format!("{p}.self_attn.q_b_proj"), self.heads * qk, r, false);
                }
                None => self.linear(&mut t, &format!("{p}.self_attn.q_proj"), self.heads * qk, h, false),
            }
            self.linear(&mut t, &format!("{p}.self_attn.kv_a_proj_with_mqa"), self.kv_lora + self.rope, h, false);
            t.push(norm(&format!("{p}.self_attn.kv_a_layernorm.weight"), self.kv_lora));
            self.linear(&mut t, &format!("{p}.self_attn.kv_b_proj"), self.heads * (self.nope + self.v), self.kv_lora, false);
            self.linear(&mut t, &format!("{p}.self_attn.o_proj"), h, self.heads * self.v, false);
            if l < self.first_dense {
                self.mlp(&mut t, &format!("{p}.mlp"), self.intermediate, false);
            } else {
                t.push(dense(&format!("{p}.mlp.gate.weight"), self.experts, h, 1.0));
                let bias = TensorSpec::new(format!("{p}.mlp.gate.e_score_correction_bias"), Dtype::F32, &[self.experts]);
                t.push((bias, Fill::Bias(self.routing.skew)));
                for e in 0..self.experts {
                    self.mlp(&mut t, &format!("{p}.mlp.experts.{e}"), self.moe_intermediate, true);
                }
                self.mlp(&mut t, &format!("{p}.mlp.shared_experts"), self.moe_intermediate, false);
            }
        }
        t.push(norm("model.norm.weight", h));
        t.push(dense("lm_head.weight", v, h, 4.0));
        t
    }

    fn mlp(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str, width: usize, routed: bool) {
        self.linear(t, &format!("{p}.gate_proj"), width, self.hidden, routed);
        self.linear(t, &format!("{p}.up_proj"), width, self.hidden, routed);
        self.linear(t, &format!("{p}.down_proj"), self.hidden, width, routed);
    }

    fn linear(&self, t: &mut Vec<(TensorSpec, Fill)>, module: &str, rows: usize, cols: usize, routed: bool) {
        let gain = 1.0 / (cols as f32).sqrt();
        match self.format {
            ExpertFormat::Fp8 => {
                t.push((TensorSpec::new(format!("{module}.weight"), Dtype::F8E4M3, &[rows, cols]), Fill::Fp8));
                let scales = [rows.div_ceil(128), cols.div_ceil(128)];
                t.push((TensorSpec::new(format!("{module}.weight_scale_inv"), Dtype::F32, &scales), Fill::Scale(gain / 2.0)));
            }
            ExpertFormat::Int4 if routed => {
                t.push((TensorSpec::new(format!("{module}.weight_packed"), Dtype::I32, &[rows, cols / 8]), Fill::Bytes));
                let scale = TensorSpec::new(format!("{module}.weight_scale"), Dtype::BF16, &[rows, cols / 32]);
                t.push((scale, Fill::Uniform(gain / 8.0, gain / 4.0)));
                t.push((TensorSpec::new(format!("{module}.weight_shape"), Dtype::I64, &[2]), Fill::Shape(rows, cols)));
            }
            _ => t.push(dense(&format!("{module}.weight"), rows, cols, 1.0)),
        }
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors().iter().map(|(t, _)| t.nbytes() as u64).sum()
    }

    /// Bytes of one routed expert.
    pub fn expert_bytes(&self) -> u64 {
        let mut t = Vec::new();
        self.mlp(&mut t, "x", self.moe_intermediate, true);
        t.iter().map(|(t, _)| t.nbytes() as u64).sum()
    }

    /// Write the checkpoint (config, shards, index, tokenizer) into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        if self.format == ExpertFormat::Int4 && (!self.hidden.is_multiple_of(32) || !self.moe_intermediate.is_multiple_of(32)) {
            return Err(Error::InvalidArgument { field: "synth", reason: "INT4 experts need widths divisible by 32".into() });
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let tensors = self.tensors();
        let shards = self.shards.max(1);
        let parts = split_by_bytes(&tensors, shards);
        let mut weight_map = serde_json::Map::new();
        for (s, part) in parts.into_iter().enumerate() {
            let file = if shards == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", s + 1, shards)
            };
            let specs: Vec<TensorSpec> = part.iter().map(|(t, _)| t.clone()).collect();
            for t in &specs {
                weight_map.insert(t.name.clone(), json!(file));
            }
            write_safetensors(&dir.join(&file), &specs, &[("format", "pt")], |i, out| {
                let (spec, fill) = &part[i];
                fill.write(spec, self.seed, out)
            })?;
        }
        if shards > 1 {
            let index = json!({"metadata": {}, "weight_map": weight_map});
            write_atomic(&dir.join("model.safetensors.index.json"), index.to_string().as_bytes())?;
        }
        write_byte_tokenizer(dir)?;
        let config = serde_json::to_string_pretty(&self.config()).expect("json");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }
}

/// How a tensor's bytes are generated.
#[derive(Debug, Clone, Copy)]
enum Fill {
    /// BF16 uniform with this gain over `sqrt(3 / cols)`.
    Dense(f32),
    /// BF16 values near 1.
    Norm,
    /// F32 router selection bias: small balanced noise plus N(0, skew²).
    Bias(f32),
    /// FP8 codes with moderate exponents (never NaN).
    Fp8,
    /// F32 scale multipliers around this value.
    Scale(f32),
    /// Random bytes (packed INT4 nibbles: every code is valid).
    Bytes,
    /// BF16 uniform in [lo, hi).
    Uniform(f32, f32),
    /// I64 logical shape.
    Shape(usize, usize),
}

fn dense(name: &str, rows: usize, cols: usize, gain: f32) -> (TensorSpec, Fill) {
    (TensorSpec::new(name, Dtype::BF16, &[rows, cols]), Fill::Dense(gain))
}

fn norm(name: &str, len: usize) -> (TensorSpec, Fill) {
    (TensorSpec::new(name, Dtype::BF16, &[len]), Fill::Norm)
}

/// Split the tensor list into `shards` consecutive parts of about equal bytes.
fn split_by_bytes(tensors: &[(TensorSpec, Fill)], shards: usize) -> Vec<&[(TensorSpec, Fill)]> {
    let total: usize = tensors.iter().map(|(t, _)| t.nbytes()).sum();
    let mut parts = Vec::new();
    let (mut start, mut acc) = (0, 0usize);
    for (i, (t, _)) in tensors.iter().enumerate() {
        acc += t.nbytes();
        let left = tensors.len() - i - 1;
        let want = total * (parts.len() + 1) / shards;
        if parts.len() + 1 < shards && acc >= want && left > 0 {
            parts.push(&tensors[start..=i]);
            start = i + 1;
        }
    }
    parts.push(&tensors[start..]);
    parts
}

/// Two uniforms in [0, 1) from one draw (24 bits each).
fn two_units(rng: &mut Rng) -> [f32; 2] {
    let u = rng.next_u64();
    let scale = 1.0 / (1u32 << 24) as f32;
    [(u >> 40) as f32 * scale, ((u >> 16) & 0xFF_FFFF) as f32 * scale]
}

impl Fill {
    fn elem_size(self) -> usize {
        match self {
            Fill::Dense(_) | Fill::Norm | Fill::Uniform(..) => 2,
            Fill::Bias(_) | Fill::Scale(_) => 4,
            Fill::Fp8 | Fill::Bytes => 1,
            Fill::Shape(..) => 8,
        }
    }

    fn write(self, spec: &TensorSpec, seed: u64, out: &mut dyn Write) -> std::io::Result<()> {
        if let Fill::Shape(r, c) = self {
            out.write_all(&(r as i64).to_le_bytes())?;
            return out.write_all(&(c as i64).to_le_bytes());
        }
        let count = spec.nbytes() / self.elem_size();
        let cols = *spec.shape.last().unwrap_or(&1);
        let base = Rng::keyed(seed, &spec.name).next_u64();
        let blocks: Vec<usize> = (0..count.div_ceil(BLOCK)).collect();
        for batch in blocks.chunks(8) {
            let bufs: Vec<Vec<u8>> =
                batch.par_iter().map(|&b| self.block(base, b, BLOCK.min(count - b * BLOCK), cols)).collect();
            for buf in bufs {
                out.write_all(&buf)?;
            }
        }
        Ok(())
    }

    /// Elements `block * BLOCK ..` (`n` of them) of a tensor.
    fn block(self, base: u64, block: usize, n: usize, cols: usize) -> Vec<u8> {
        let mut rng = Rng::new(base ^ (block as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let mut buf = Vec::with_capacity(n * self.elem_size());
        let bf16 = |v: f32| half::bf16::from_f32(v).to_le_bytes();
        match self {
            Fill::Dense(g) => {
                let a = g * (3.0 / cols as f32).sqrt();
                while buf.len() < 2 * n {
                    for u in two_units(&mut rng) {
                        if buf.len() < 2 * n {
                            buf.extend_from_slice(&bf16((u * 2.0 - 1.0) * a));
                        }
                    }
                }
            }
            Fill::Norm => (0..n).for_each(|_| buf.extend_from_slice(&bf16(1.0 + rng.symmetric(0.1)))),
            Fill::Bias(skew) => (0..n).for_each(|_| {
                let [u1, u2] = two_units(&mut rng);
                let normal = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
                buf.extend_from_slice(&(rng.symmetric(0.002) + skew * normal).to_le_bytes())
            }),
            Fill::Fp8 => (0..n).for_each(|_| {
                let bits = rng.next_u64();
                let exp = 4 + (bits % 6) as u8;
                buf.push(((bits >> 8) as u8 & 0x80) | (exp << 3) | ((bits >> 16) as u8 & 7));
            }),
            Fill::Scale(s) => (0..n).for_each(|_| buf.extend_from_slice(&(s * (0.5 + rng.unit())).to_le_bytes())),
            Fill::Bytes => {
                while buf.len() < n {
                    let take = (n - buf.len()).min(8);
                    buf.extend_from_slice(&rng.next_u64().to_le_bytes()[..take]);
                }
            }
            Fill::Uniform(lo, hi) => (0..n).for_each(|_| buf.extend_from_slice(&bf16(lo + (hi - lo) * rng.unit()))),
            Fill::Shape(..) => unreachable!("written directly"),
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_by_bytes_and_blocks_are_thread_independent() {
        let synth = DeepseekSynth::tiny(ExpertFormat::Bf16);
        let t = synth.tensors();
        let parts = split_by_bytes(&t, 3);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), t.len());
        let spec = TensorSpec::new("w", Dtype::BF16, &[3, BLOCK]);
        let mut a = Vec::new();
        Fill::Dense(1.0).write(&spec, 1, &mut a).unwrap();
        assert_eq!(a.len(), spec.nbytes());
        let one = Fill::Dense(1.0).block(Rng::keyed(1, "w").next_u64(), 2, BLOCK, BLOCK);
        assert_eq!(&a[2 * 2 * BLOCK..], &one[..], "block 2 does not depend on blocks 0 and 1");
    }
}
