//! Synthetic GQA mixture-of-experts checkpoints in the published layouts of gpt-oss (stacked
//! MXFP4 experts with biases, attention sinks, sliding/full layers), MiniMax-M2 (block FP8,
//! whole-projection q/k norms, Mixtral-style expert names) and Qwen3.5-MoE (the vision-language
//! wrapper's `model.language_model.` names, three gated-DeltaNet layers to one gated-attention
//! layer, block-FP8 experts plus a gated shared expert), at their real widths or scaled down,
//! for out-of-core benchmarks and tests.

use std::path::Path;

use serde_json::{Value, json};

use super::fill::{Fill, dense, norm, write_shards};
use super::kimi::e8m0_center;
use super::tokenizer::write_byte_tokenizer;
use crate::error::Result;
use crate::weights::{Dtype, TensorSpec, write_atomic};

/// Which published layout to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GqaFamily {
    GptOss,
    MiniMaxM2,
    Qwen35,
}

/// The shape of a synthetic GQA MoE checkpoint.
#[derive(Debug, Clone)]
pub struct GqaMoeSynth {
    pub family: GqaFamily,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Each expert's width.
    pub width: usize,
    /// The shared expert's width (Qwen3.5; 0 otherwise).
    pub shared_width: usize,
    /// Gated-DeltaNet key and value heads and their width (Qwen3.5; unused otherwise).
    pub linear_heads: (usize, usize),
    pub linear_head_dim: usize,
    pub max_position: usize,
    pub shards: usize,
    pub seed: u64,
}

impl GqaMoeSynth {
    /// gpt-oss-120b's widths (hidden 2880, 64 q / 8 kv heads of 64, 128 experts of width 2880,
    /// top-4) with `layers` layers.
    pub fn gpt_oss_120b(layers: usize) -> Self {
        GqaMoeSynth {
            family: GqaFamily::GptOss,
            hidden: 2880,
            heads: 64,
            kv_heads: 8,
            head_dim: 64,
            layers,
            experts: 128,
            top_k: 4,
            width: 2880,
            shared_width: 0,
            linear_heads: (0, 0),
            linear_head_dim: 0,
            max_position: 4096,
            shards: 4,
            seed: 0x5EED,
        }
    }

    /// MiniMax-M2's widths (hidden 3072, 48 q / 8 kv heads of 128, 256 experts of width 1536,
    /// top-8) with `layers` layers.
    pub fn minimax_m2(layers: usize) -> Self {
        GqaMoeSynth {
            family: GqaFamily::MiniMaxM2,
            hidden: 3072,
            heads: 48,
            kv_heads: 8,
            head_dim: 128,
            layers,
            experts: 256,
            top_k: 8,
            width: 1536,
            ..Self::gpt_oss_120b(layers)
        }
    }

    /// Qwen3.5-397B-A17B's widths (hidden 4096; gated attention with 32 q / 2 kv heads of 256;
    /// gated DeltaNet with 16 key / 64 value heads of 128; 512 experts of width 1024, top-10,
    /// one shared expert of 1024) with `layers` layers, every fourth one attention.
    pub fn qwen35_397b(layers: usize) -> Self {
        GqaMoeSynth {
            family: GqaFamily::Qwen35,
            hidden: 4096,
            heads: 32,
            kv_heads: 2,
            head_dim: 256,
            layers,
            experts: 512,
            top_k: 10,
            width: 1024,
            shared_width: 1024,
            linear_heads: (16, 64),
            linear_head_dim: 128,
            ..Self::gpt_oss_120b(layers)
        }
    }

    /// A tiny model of `family` for tests.
    pub fn tiny(family: GqaFamily) -> Self {
        let qwen = family == GqaFamily::Qwen35;
        GqaMoeSynth {
            family,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            layers: if qwen { 4 } else { 3 },
            experts: 8,
            top_k: 2,
            width: 32,
            shared_width: if qwen { 32 } else { 0 },
            linear_heads: (2, 4),
            linear_head_dim: 16,
            max_position: 512,
            shards: 2,
            seed: 0x5EED,
        }
    }

    /// Whether layer `l` is a gated-DeltaNet layer (Qwen3.5: all but every fourth).
    fn is_linear(&self, l: usize) -> bool {
        self.family == GqaFamily::Qwen35 && !(l + 1).is_multiple_of(4)
    }

    /// Qwen3.5's `config.json`: the vision-language wrapper around the text config.
    fn qwen35_config(&self) -> Value {
        let (kh, vh) = self.linear_heads;
        let layer_types: Vec<&str> = (0..self.layers)
            .map(|l| {
                if self.is_linear(l) {
                    "linear_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        json!({
            "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "tie_word_embeddings": false, "torch_dtype": "bfloat16", "deltafin_synthetic": true,
            "text_config": {
                "model_type": "qwen3_5_moe_text", "vocab_size": 258, "hidden_size": self.hidden,
                "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "linear_num_key_heads": kh, "linear_num_value_heads": vh,
                "linear_key_head_dim": self.linear_head_dim, "linear_value_head_dim": self.linear_head_dim,
                "linear_conv_kernel_dim": 4, "layer_types": layer_types,
                "num_experts": self.experts, "num_experts_per_tok": self.top_k,
                "moe_intermediate_size": self.width, "shared_expert_intermediate_size": self.shared_width,
                "max_position_embeddings": self.max_position, "rms_norm_eps": 1e-6, "hidden_act": "silu",
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
                "bos_token_id": 256, "eos_token_id": 257, "tie_word_embeddings": false,
            },
            "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128]},
        })
    }

    /// The `config.json` contents.
    pub fn config(&self) -> Value {
        if self.family == GqaFamily::Qwen35 {
            return self.qwen35_config();
        }
        let mut c = json!({
            "vocab_size": 258, "hidden_size": self.hidden, "intermediate_size": self.width,
            "num_hidden_layers": self.layers, "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "num_local_experts": self.experts, "num_experts_per_tok": self.top_k,
            "max_position_embeddings": self.max_position, "tie_word_embeddings": false,
            "bos_token_id": 256, "eos_token_id": 257, "hidden_act": "silu", "torch_dtype": "bfloat16",
            "deltafin_synthetic": true,
        });
        let extra = match self.family {
            GqaFamily::GptOss => json!({
                "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "rms_norm_eps": 1e-5,
                "sliding_window": 128, "attention_bias": true, "swiglu_limit": 7.0,
                "layer_types": (0..self.layers)
                    .map(|i| if i % 2 == 0 { "sliding_attention" } else { "full_attention" })
                    .collect::<Vec<_>>(),
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                    "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 4096},
                "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert":
                    ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
            }),
            GqaFamily::MiniMaxM2 => json!({
                "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "rms_norm_eps": 1e-6,
                "rope_theta": 5000000.0, "rotary_dim": self.head_dim / 2, "use_qk_norm": true,
                "qk_norm_type": "per_layer", "scoring_func": "sigmoid", "use_routing_bias": true,
                "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                    "weight_block_size": [128, 128], "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]},
            }),
            GqaFamily::Qwen35 => unreachable!("written by qwen35_config"),
        };
        let (Value::Object(c_map), Value::Object(extra)) = (&mut c, extra) else {
            unreachable!("both are objects")
        };
        c_map.extend(extra);
        c
    }

    /// Every tensor, in file order, with how to fill it.
    fn tensors(&self) -> Vec<(TensorSpec, Fill)> {
        let mut t = vec![dense(
            "model.embed_tokens.weight",
            258,
            self.hidden,
            8.0 * (self.hidden as f32).sqrt(),
        )];
        let qwen = self.family == GqaFamily::Qwen35;
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            t.push(self.norm(&format!("{p}.input_layernorm.weight"), self.hidden));
            t.push(self.norm(&format!("{p}.post_attention_layernorm.weight"), self.hidden));
            match self.is_linear(l) {
                true => self.delta_net(&mut t, &p),
                false => self.attention(&mut t, &p),
            }
            match self.family {
                GqaFamily::GptOss => self.gpt_oss_moe(&mut t, &p),
                GqaFamily::MiniMaxM2 => self.minimax_moe(&mut t, &p),
                GqaFamily::Qwen35 => self.qwen35_moe(&mut t, &p),
            }
        }
        t.push(self.norm("model.norm.weight", self.hidden));
        if qwen {
            for (spec, _) in t.iter_mut() {
                spec.name = spec.name.replacen("model.", "model.language_model.", 1);
            }
        }
        t.push(dense("lm_head.weight", 258, self.hidden, 4.0));
        t
    }

    /// An RMSNorm weight: around 1, or around 0 where the norm is zero-centred (Qwen3.5's
    /// `1 + w`).
    fn norm(&self, name: &str, len: usize) -> (TensorSpec, Fill) {
        match self.family {
            GqaFamily::Qwen35 => vector(name, len, 0.1),
            _ => norm(name, len),
        }
    }

    /// Qwen3.5's gated DeltaNet: block-FP8 `in_proj_qkv`, `in_proj_z` and `out_proj`; BF16
    /// `in_proj_b`/`in_proj_a`, conv and per-head constants (as published).
    fn delta_net(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let ((kh, vh), d, h) = (self.linear_heads, self.linear_head_dim, self.hidden);
        let (key_dim, value_dim) = (kh * d, vh * d);
        let m = format!("{p}.linear_attn");
        fp8(t, &format!("{m}.in_proj_qkv"), 2 * key_dim + value_dim, h);
        fp8(t, &format!("{m}.in_proj_z"), value_dim, h);
        t.push(dense(&format!("{m}.in_proj_b.weight"), vh, h, 1.0));
        t.push(dense(&format!("{m}.in_proj_a.weight"), vh, h, 1.0));
        t.push((
            TensorSpec::new(
                format!("{m}.conv1d.weight"),
                Dtype::BF16,
                &[2 * key_dim + value_dim, 1, 4],
            ),
            Fill::Uniform(-0.5, 0.5),
        ));
        t.push(vector(&format!("{m}.dt_bias"), vh, 1.0));
        t.push((
            TensorSpec::new(format!("{m}.A_log"), Dtype::F32, &[vh]),
            Fill::F32Uniform(-1.0, 1.0),
        ));
        t.push(norm(&format!("{m}.norm.weight"), d));
        fp8(t, &format!("{m}.out_proj"), h, value_dim);
    }

    /// Qwen3.5's MoE: BF16 router and shared-expert gate, block-FP8 experts and shared expert.
    fn qwen35_moe(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let (h, w, e) = (self.hidden, self.width, self.experts);
        t.push(dense(&format!("{p}.mlp.gate.weight"), e, h, 1.0));
        t.push(dense(&format!("{p}.mlp.shared_expert_gate.weight"), 1, h, 1.0));
        let sw = self.shared_width;
        let experts = (0..e).map(|x| (format!("{p}.mlp.experts.{x}"), w));
        for (m, width) in std::iter::once((format!("{p}.mlp.shared_expert"), sw)).chain(experts) {
            fp8(t, &format!("{m}.gate_proj"), width, h);
            fp8(t, &format!("{m}.up_proj"), width, h);
            fp8(t, &format!("{m}.down_proj"), h, width);
        }
    }

    fn attention(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        // Qwen3.5's q_proj also yields the output gate.
        let q_rows = if self.family == GqaFamily::Qwen35 {
            2 * q
        } else {
            q
        };
        for (name, rows, cols) in [
            ("q_proj", q_rows, h),
            ("k_proj", kv, h),
            ("v_proj", kv, h),
            ("o_proj", h, q),
        ] {
            let module = format!("{p}.self_attn.{name}");
            match self.family {
                GqaFamily::GptOss => {
                    t.push(dense(&format!("{module}.weight"), rows, cols, 1.0));
                    t.push(vector(&format!("{module}.bias"), rows, 0.05));
                }
                GqaFamily::MiniMaxM2 | GqaFamily::Qwen35 => fp8(t, &module, rows, cols),
            }
        }
        match self.family {
            GqaFamily::GptOss => t.push(vector(&format!("{p}.self_attn.sinks"), self.heads, 1.0)),
            GqaFamily::MiniMaxM2 => {
                t.push(norm(&format!("{p}.self_attn.q_norm.weight"), q));
                t.push(norm(&format!("{p}.self_attn.k_norm.weight"), kv));
            }
            GqaFamily::Qwen35 => {
                let d = self.head_dim;
                t.push(self.norm(&format!("{p}.self_attn.q_norm.weight"), d));
                t.push(self.norm(&format!("{p}.self_attn.k_norm.weight"), d));
            }
        }
    }

    fn gpt_oss_moe(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let (h, w, e) = (self.hidden, self.width, self.experts);
        t.push(dense(&format!("{p}.mlp.router.weight"), e, h, 1.0));
        t.push(vector(&format!("{p}.mlp.router.bias"), e, 0.05));
        for (name, rows, cols) in [("gate_up_proj", 2 * w, h), ("down_proj", h, w)] {
            let base = format!("{p}.mlp.experts.{name}");
            t.push((
                TensorSpec::new(format!("{base}_blocks"), Dtype::U8, &[e, rows, cols / 32, 16]),
                Fill::Bytes,
            ));
            t.push((
                TensorSpec::new(format!("{base}_scales"), Dtype::U8, &[e, rows, cols / 32]),
                Fill::E8m0(e8m0_center(cols)),
            ));
            t.push((
                TensorSpec::new(format!("{base}_bias"), Dtype::BF16, &[e, rows]),
                Fill::Uniform(-0.05, 0.05),
            ));
        }
    }

    fn minimax_moe(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let (h, w, e) = (self.hidden, self.width, self.experts);
        t.push(dense(&format!("{p}.block_sparse_moe.gate.weight"), e, h, 1.0));
        t.push((
            TensorSpec::new(
                format!("{p}.block_sparse_moe.e_score_correction_bias"),
                Dtype::F32,
                &[e],
            ),
            Fill::SkewedBias(0.0),
        ));
        for x in 0..e {
            let m = format!("{p}.block_sparse_moe.experts.{x}");
            fp8(t, &format!("{m}.w1"), w, h);
            fp8(t, &format!("{m}.w3"), w, h);
            fp8(t, &format!("{m}.w2"), h, w);
        }
    }

    /// Total bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors().iter().map(|(t, _)| t.nbytes() as u64).sum()
    }

    /// Bytes of one routed expert (its share of the stacked tensors for gpt-oss).
    pub fn expert_bytes(&self) -> u64 {
        let moe: u64 = self
            .tensors()
            .iter()
            .filter(|(t, _)| t.name.contains("layers.0.") && t.name.contains(".experts."))
            .map(|(t, _)| t.nbytes() as u64)
            .sum();
        moe / self.experts as u64
    }

    /// Write the checkpoint (config, shards, index, tokenizer) into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_shards(dir, &self.tensors(), self.shards, self.seed)?;
        write_byte_tokenizer(dir)?;
        let config = serde_json::to_string_pretty(&self.config()).expect("json");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }
}

/// A BF16 vector uniform in `±amp`.
fn vector(name: &str, len: usize, amp: f32) -> (TensorSpec, Fill) {
    (
        TensorSpec::new(name, Dtype::BF16, &[len]),
        Fill::Uniform(-amp, amp),
    )
}

/// A block-FP8 Linear with its `weight_scale_inv`.
fn fp8(t: &mut Vec<(TensorSpec, Fill)>, module: &str, rows: usize, cols: usize) {
    t.push((
        TensorSpec::new(format!("{module}.weight"), Dtype::F8E4M3, &[rows, cols]),
        Fill::Fp8,
    ));
    t.push((
        TensorSpec::new(
            format!("{module}.weight_scale_inv"),
            Dtype::F32,
            &[rows.div_ceil(128), cols.div_ceil(128)],
        ),
        Fill::Scale(0.5 / (cols as f32).sqrt()),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{self, LogitRows, SeqInput};
    use crate::cache::OocOptions;

    fn logits(m: &dyn arch::Model, tokens: &[u32]) -> Vec<u32> {
        let mut state = m.new_state();
        let mut batch = [SeqInput {
            state: &mut state,
            tokens,
            logits: LogitRows::All,
        }];
        m.forward(&mut batch, None)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn tiny_presets_load_and_run_the_same_in_memory_and_out_of_core() {
        for family in [GqaFamily::GptOss, GqaFamily::MiniMaxM2, GqaFamily::Qwen35] {
            let dir = tempfile::tempdir().unwrap();
            GqaMoeSynth::tiny(family).write(dir.path()).unwrap();
            let model = arch::load(dir.path()).unwrap();
            let tokens: Vec<u32> = (0..9).map(|i| (i * 37 + 5) % 256).collect();
            let want = logits(model.as_ref(), &tokens);
            assert!(want.iter().all(|b| f32::from_bits(*b).is_finite()), "{family:?}");
            let mut o = OocOptions::with_budget(u64::MAX / 4);
            o.reserve_bytes = 0;
            let (ooc, _rt) = arch::load_budgeted(dir.path(), &o).unwrap();
            assert_eq!(logits(ooc.as_ref(), &tokens), want, "{family:?}");
        }
    }
}
