//! Synthetic DeepSeek-V3-architecture checkpoints (BF16 spine; BF16, block-FP8 or INT4 experts),
//! and with [`DsaShape`] GLM-5's (`glm_moe_dsa`: the same stack with DeepSeek Sparse Attention's
//! lightning indexer, a full indexer every `freq` layers).
//!
//! Routing shape ([`RoutingShape`], `super::routing`): the per-layer selection-bias skew and
//! the embedding scale that sets temporal reuse.

use std::path::Path;

use serde_json::{Value, json};

use super::fill::{Fill, dense, norm, write_shards};
use super::routing::RoutingShape;
use super::write_byte_tokenizer;
use crate::error::{Error, Result};
use crate::weights::{Dtype, TensorSpec, write_atomic};

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
    /// DeepSeek Sparse Attention (`None`: DeepSeek-V3's dense MLA).
    pub dsa: Option<DsaShape>,
}

/// The lightning indexer of a GLM-5 checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsaShape {
    pub heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    /// A full indexer on every `freq`-th layer from the first, the others `"shared"` (GLM-5:
    /// 1; GLM-5.2's IndexShare: 4).
    pub freq: usize,
}

impl DsaShape {
    /// GLM-5's indexer (32 heads of 128, top-2048) with a full indexer every `freq` layers.
    pub fn glm5(freq: usize) -> Self {
        DsaShape {
            heads: 32,
            head_dim: 128,
            topk: 2048,
            freq: freq.max(1),
        }
    }

    fn full(&self, layer: usize) -> bool {
        layer.is_multiple_of(self.freq)
    }
}

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
            dsa: None,
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
            dsa: None,
        }
    }

    /// GLM-5's shapes (`glm_moe_dsa`: hidden 6144, 64 heads with Q-LoRA 2048, latent 512, nope
    /// 192, rope 64, v 256, 256 experts of width 2048, top-8, one shared expert, a dense first
    /// layer, the 32-head indexer choosing 2048 positions), `layers` layers.
    pub fn glm5(layers: usize, format: ExpertFormat) -> Self {
        DeepseekSynth {
            hidden: 6144,
            intermediate: 12288,
            moe_intermediate: 2048,
            layers,
            heads: 64,
            q_lora: Some(2048),
            kv_lora: 512,
            nope: 192,
            rope: 64,
            v: 256,
            experts: 256,
            top_k: 8,
            n_group: 1,
            topk_group: 1,
            first_dense: 1,
            max_position: 202_752,
            format,
            shards: 4,
            seed: 0x61A5,
            routing: RoutingShape::default(),
            dsa: Some(DsaShape::glm5(1)),
        }
    }

    /// The same attention state per position (MLA latent and rope key, the DSA indexer's key
    /// and top-k) with little compute, for context-memory measurements at long lengths: hidden
    /// 256, 2 heads, 2 indexer heads and 8 narrow experts.
    pub fn narrow(self) -> Self {
        DeepseekSynth {
            hidden: 256,
            intermediate: 512,
            moe_intermediate: 64,
            heads: 2,
            q_lora: self.q_lora.map(|_| 64),
            experts: 8,
            top_k: self.top_k.min(4),
            dsa: self.dsa.map(|d| DsaShape { heads: 2, ..d }),
            ..self
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
        if let Some(d) = self.dsa {
            c["architectures"] = json!(["GlmMoeDsaForCausalLM"]);
            c["model_type"] = json!("glm_moe_dsa");
            c["index_n_heads"] = json!(d.heads);
            c["index_head_dim"] = json!(d.head_dim);
            c["index_topk"] = json!(d.topk);
            let kinds: Vec<&str> = (0..self.layers)
                .map(|l| if d.full(l) { "full" } else { "shared" })
                .collect();
            c["indexer_types"] = json!(kinds);
            // GLM-5 publishes plain RoPE (θ 10⁶), not DeepSeek-V3's YaRN.
            c["rope_theta"] = json!(1_000_000.0);
            c.as_object_mut().expect("object").remove("rope_scaling");
        }
        match self.format {
            ExpertFormat::Bf16 => {}
            ExpertFormat::Fp8 => {
                c["quantization_config"] = json!({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]});
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
        let embed_rms = self.routing.embed_rms();
        t.push(dense(
            "model.embed_tokens.weight",
            v,
            h,
            embed_rms * (h as f32).sqrt(),
        ));
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            t.push(norm(&format!("{p}.input_layernorm.weight"), h));
            t.push(norm(&format!("{p}.post_attention_layernorm.weight"), h));
            let qk = self.nope + self.rope;
            match self.q_lora {
                Some(r) => {
                    self.linear(&mut t, &format!("{p}.self_attn.q_a_proj"), r, h, false);
                    t.push(norm(&format!("{p}.self_attn.q_a_layernorm.weight"), r));
                    self.linear(
                        &mut t,
                        &format!("{p}.self_attn.q_b_proj"),
                        self.heads * qk,
                        r,
                        false,
                    );
                }
                None => self.linear(
                    &mut t,
                    &format!("{p}.self_attn.q_proj"),
                    self.heads * qk,
                    h,
                    false,
                ),
            }
            self.linear(
                &mut t,
                &format!("{p}.self_attn.kv_a_proj_with_mqa"),
                self.kv_lora + self.rope,
                h,
                false,
            );
            t.push(norm(
                &format!("{p}.self_attn.kv_a_layernorm.weight"),
                self.kv_lora,
            ));
            if let Some(d) = self.dsa.filter(|d| d.full(l)) {
                self.indexer(&mut t, &format!("{p}.self_attn.indexer"), d);
            }
            self.linear(
                &mut t,
                &format!("{p}.self_attn.kv_b_proj"),
                self.heads * (self.nope + self.v),
                self.kv_lora,
                false,
            );
            self.linear(
                &mut t,
                &format!("{p}.self_attn.o_proj"),
                h,
                self.heads * self.v,
                false,
            );
            if l < self.first_dense {
                self.mlp(&mut t, &format!("{p}.mlp"), self.intermediate, false);
            } else {
                t.push(dense(&format!("{p}.mlp.gate.weight"), self.experts, h, 1.0));
                t.push((
                    TensorSpec::new(
                        format!("{p}.mlp.gate.e_score_correction_bias"),
                        Dtype::F32,
                        &[self.experts],
                    ),
                    Fill::SkewedBias(self.routing.layer_skew(self.seed, l)),
                ));
                for e in 0..self.experts {
                    self.mlp(
                        &mut t,
                        &format!("{p}.mlp.experts.{e}"),
                        self.moe_intermediate,
                        true,
                    );
                }
                self.mlp(
                    &mut t,
                    &format!("{p}.mlp.shared_experts"),
                    self.moe_intermediate,
                    false,
                );
            }
        }
        t.push(norm("model.norm.weight", h));
        t.push(dense("lm_head.weight", v, h, 4.0));
        t
    }

    /// A lightning indexer's tensors (`wq_b` and `wk` in the Linear format, the rest BF16).
    fn indexer(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str, d: DsaShape) {
        let q_lora = self.q_lora.unwrap_or(self.hidden);
        self.linear(t, &format!("{p}.wq_b"), d.heads * d.head_dim, q_lora, false);
        self.linear(t, &format!("{p}.wk"), d.head_dim, self.hidden, false);
        t.push(norm(&format!("{p}.k_norm.weight"), d.head_dim));
        t.push((
            TensorSpec::new(format!("{p}.k_norm.bias"), Dtype::F32, &[d.head_dim]),
            Fill::Bias,
        ));
        t.push(dense(
            &format!("{p}.weights_proj.weight"),
            d.heads,
            self.hidden,
            1.0,
        ));
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
                t.push((
                    TensorSpec::new(format!("{module}.weight"), Dtype::F8E4M3, &[rows, cols]),
                    Fill::Fp8,
                ));
                let scales = [rows.div_ceil(128), cols.div_ceil(128)];
                t.push((
                    TensorSpec::new(format!("{module}.weight_scale_inv"), Dtype::F32, &scales),
                    Fill::Scale(gain / 2.0),
                ));
            }
            ExpertFormat::Int4 if routed => {
                t.push((
                    TensorSpec::new(format!("{module}.weight_packed"), Dtype::I32, &[rows, cols / 8]),
                    Fill::Bytes,
                ));
                let scale =
                    TensorSpec::new(format!("{module}.weight_scale"), Dtype::BF16, &[rows, cols / 32]);
                t.push((scale, Fill::Uniform(gain / 8.0, gain / 4.0)));
                t.push((
                    TensorSpec::new(format!("{module}.weight_shape"), Dtype::I64, &[2]),
                    Fill::Shape(rows, cols),
                ));
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
        if self.format == ExpertFormat::Int4
            && (!self.hidden.is_multiple_of(32) || !self.moe_intermediate.is_multiple_of(32))
        {
            return Err(Error::InvalidArgument {
                field: "synth",
                reason: "INT4 experts need widths divisible by 32".into(),
            });
        }
        write_shards(dir, &self.tensors(), self.shards, self.seed)?;
        write_byte_tokenizer(dir)?;
        let config = serde_json::to_string_pretty(&self.config()).expect("json");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }
}
