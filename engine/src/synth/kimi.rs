//! Synthetic Kimi K3 and Kimi-Linear checkpoints in their real on-disk forms.
//!
//! K3 ([`KimiVariant::K3`], `kimi-k3.md` §1.1, §2.2–2.3): outer `kimi_k3` config with a
//! `kimi_linear` `text_config` carrying the compressed-tensors `mxfp4-pack-quantized`
//! `quantization_config`; every tensor prefixed `language_model.`; BF16 spine; F32 `A_log`
//! (`[head_dim]`, per key channel), `dt_bias`, conv weights, `o_norm` and router bias; routed
//! experts as MXFP4 `block_sparse_moe.experts.{e}.w{1,2,3}.weight_{packed,scale}` (U8), written
//! contiguously per expert in the order w1p, w1s, w2p, w2s, w3p, w3s.
//!
//! Kimi-Linear ([`KimiVariant::Linear`]): flat `kimi_linear` config, BF16 everything except the
//! F32 KDA tensors, per-head `A_log` `[1, 1, heads, 1]`, low-rank KDA output gate, BF16 experts.

use std::path::Path;

use serde_json::{Value, json};

use super::fill::{Fill, dense, norm, write_shards};
use super::tokenizer::{TokenizerFlavor, write_byte_tokenizer_flavor};
use crate::error::{Error, Result};
use crate::weights::{Dtype, TensorSpec, write_atomic};

/// Which Kimi architecture to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KimiVariant {
    K3,
    Linear,
}

/// Shape of a synthetic Kimi checkpoint (any small shape; MXFP4 needs the expert input widths
/// `routed_expert_hidden_size` and `moe_intermediate` to be multiples of 32).
#[derive(Debug, Clone)]
pub struct KimiSynth {
    pub variant: KimiVariant,
    pub hidden: usize,
    /// Dense FFN width (layers before `first_dense`).
    pub intermediate: usize,
    pub moe_intermediate: usize,
    /// Latent MoE width (K3 only).
    pub latent: usize,
    pub layers: usize,
    /// One-based MLA layers; the rest are KDA.
    pub full_attn_layers: Vec<usize>,
    pub heads: usize,
    pub q_lora: Option<usize>,
    pub kv_lora: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub kda_heads: usize,
    pub kda_head_dim: usize,
    pub conv: usize,
    pub experts: usize,
    pub top_k: usize,
    pub shared: usize,
    /// Block AttnRes block length (K3 only).
    pub block_size: usize,
    pub first_dense: usize,
    pub max_position: usize,
    pub shards: usize,
    pub seed: u64,
}

/// The K3-format writer (a [`KimiSynth`] with `variant: K3`).
pub type KimiK3Synth = KimiSynth;

const VOCAB: usize = 512;
const BOS: usize = 256;
/// `<|end_of_msg|>` (K3) / `[EOS]` (Kimi-Linear's eos is `<|im_end|>` + 2 as well).
const EOS: usize = 258;
const PAD: usize = 511;

impl KimiSynth {
    /// The built-in default model: a small K3-architecture checkpoint.
    pub fn k3_builtin() -> Self {
        KimiSynth {
            variant: KimiVariant::K3,
            hidden: 256,
            intermediate: 512,
            moe_intermediate: 128,
            latent: 128,
            layers: 6,
            full_attn_layers: vec![4, 6],
            heads: 4,
            q_lora: Some(128),
            kv_lora: 64,
            nope: 32,
            rope: 16,
            v: 32,
            kda_heads: 4,
            kda_head_dim: 32,
            conv: 4,
            experts: 16,
            top_k: 4,
            shared: 2,
            block_size: 2,
            first_dense: 1,
            max_position: 1 << 20,
            shards: 1,
            seed: 0x5EED_0003,
        }
    }

    /// A tiny K3 model for tests: 6 layers (MLA at one-based 3 and 6), 3 AttnRes blocks.
    pub fn k3_tiny() -> Self {
        KimiSynth {
            variant: KimiVariant::K3,
            hidden: 64,
            intermediate: 96,
            moe_intermediate: 32,
            latent: 32,
            layers: 6,
            full_attn_layers: vec![3, 6],
            heads: 2,
            q_lora: Some(32),
            kv_lora: 16,
            nope: 16,
            rope: 8,
            v: 16,
            kda_heads: 2,
            kda_head_dim: 16,
            conv: 4,
            experts: 8,
            top_k: 3,
            shared: 2,
            block_size: 2,
            first_dense: 1,
            max_position: 1 << 16,
            shards: 2,
            seed: 11,
        }
    }

    /// A tiny Kimi-Linear model for tests: 4 layers (MLA at one-based 2 and 4).
    pub fn linear_tiny() -> Self {
        KimiSynth {
            variant: KimiVariant::Linear,
            layers: 4,
            full_attn_layers: vec![2, 4],
            q_lora: None,
            top_k: 2,
            shared: 1,
            seed: 13,
            ..Self::k3_tiny()
        }
    }

    fn kda_layers(&self) -> Vec<usize> {
        (1..=self.layers)
            .filter(|l| !self.full_attn_layers.contains(l))
            .collect()
    }

    /// The `config.json` contents.
    pub fn config(&self) -> Value {
        let mut text = json!({
            "vocab_size": VOCAB, "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "moe_intermediate_size": self.moe_intermediate, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.heads, "q_lora_rank": self.q_lora,
            "kv_lora_rank": self.kv_lora, "qk_nope_head_dim": self.nope, "qk_rope_head_dim": self.rope,
            "v_head_dim": self.v, "mla_use_nope": true, "num_experts": self.experts,
            "num_experts_per_token": self.top_k, "num_shared_experts": self.shared, "num_expert_group": 1,
            "topk_group": 1, "use_grouped_topk": true, "moe_renormalize": true, "moe_router_activation_func": "sigmoid",
            "first_k_dense_replace": self.first_dense, "moe_layer_freq": 1, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": false, "use_cache": true, "num_nextn_predict_layers": 0,
            "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
            "linear_attn_config": {
                "head_dim": self.kda_head_dim, "num_heads": self.kda_heads, "short_conv_kernel_size": self.conv,
                "kda_layers": self.kda_layers(), "full_attn_layers": self.full_attn_layers,
            },
        });
        let t = text.as_object_mut().expect("object");
        match self.variant {
            KimiVariant::Linear => {
                let extra = json!({
                    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_act": "silu",
                    "routed_scaling_factor": 2.446, "model_max_length": self.max_position, "torch_dtype": "bfloat16",
                    "deltafin_synthetic": true,
                });
                t.extend(extra.as_object().expect("object").clone());
                text
            }
            KimiVariant::K3 => {
                let extra = json!({
                    "model_type": "kimi_linear", "dtype": "bfloat16", "hidden_act": "situ",
                    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "routed_scaling_factor": 1.0,
                    "topk_method": "noaux_tc", "routed_expert_hidden_size": self.latent, "latent_moe_use_norm": true,
                    "mla_use_output_gate": true, "attn_res_block_size": self.block_size,
                    "max_position_embeddings": self.max_position, "quantization_config": mxfp4_quantization(),
                });
                t.extend(extra.as_object().expect("object").clone());
                t["linear_attn_config"]["use_full_rank_gate"] = json!(true);
                t["linear_attn_config"]["gate_lower_bound"] = json!(-5.0);
                json!({
                    "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "dtype": "bfloat16",
                    "tie_word_embeddings": false, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
                    "deltafin_synthetic": true, "text_config": text,
                })
            }
        }
    }

    /// Tensor name with the variant's prefix.
    fn name(&self, n: &str) -> String {
        match self.variant {
            KimiVariant::K3 => format!("language_model.{n}"),
            KimiVariant::Linear => n.to_string(),
        }
    }

    /// Every tensor, in file order, with how to fill it.
    fn tensors(&self) -> Vec<(TensorSpec, Fill)> {
        let mut t = Vec::new();
        let (h, k3) = (self.hidden, self.variant == KimiVariant::K3);
        t.push(dense(&self.name("model.embed_tokens.weight"), VOCAB, h, 1.0));
        for l in 0..self.layers {
            let p = self.name(&format!("model.layers.{l}"));
            t.push(norm(&format!("{p}.input_layernorm.weight"), h));
            t.push(norm(&format!("{p}.post_attention_layernorm.weight"), h));
            if k3 {
                for site in ["self_attention", "mlp"] {
                    t.push(norm(&format!("{p}.{site}_res_norm.weight"), h));
                    t.push(dense(&format!("{p}.{site}_res_proj.weight"), 1, h, 2.0));
                }
            }
            if self.full_attn_layers.contains(&(l + 1)) {
                self.mla(&mut t, &p);
            } else {
                self.kda(&mut t, &p);
            }
            if l < self.first_dense {
                for (name, rows, cols) in self.mlp_shapes(self.intermediate, h) {
                    t.push(dense(&format!("{p}.mlp.{name}.weight"), rows, cols, 1.0));
                }
            } else {
                self.moe(&mut t, &format!("{p}.block_sparse_moe"));
            }
        }
        t.push(norm(&self.name("model.norm.weight"), h));
        if k3 {
            t.push(norm(&self.name("model.output_attn_res_norm.weight"), h));
            t.push(dense(&self.name("model.output_attn_res_proj.weight"), 1, h, 2.0));
        }
        t.push(dense(&self.name("lm_head.weight"), VOCAB, h, 4.0));
        t
    }

    /// `(gate, up, down)` names and shapes of a gated MLP of `width` over `input`.
    fn mlp_shapes(&self, width: usize, input: usize) -> [(&'static str, usize, usize); 3] {
        [
            ("gate_proj", width, input),
            ("up_proj", width, input),
            ("down_proj", input, width),
        ]
    }

    fn kda(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let (h, d, heads) = (self.hidden, self.kda_head_dim, self.kda_heads);
        let pw = heads * d;
        let a = format!("{p}.self_attn");
        let f32_tensor = |name: &str, shape: &[usize], fill: Fill| {
            (TensorSpec::new(format!("{a}.{name}"), Dtype::F32, shape), fill)
        };
        let a_log_shape: Vec<usize> = if self.variant == KimiVariant::K3 {
            vec![d]
        } else {
            vec![1, 1, heads, 1]
        };
        t.push(f32_tensor("A_log", &a_log_shape, Fill::F32LogUniform(1.0, 16.0)));
        t.push(f32_tensor("dt_bias", &[pw], Fill::F32Uniform(-1.0, 1.0)));
        for s in ["q", "k", "v"] {
            t.push(f32_tensor(
                &format!("{s}_conv1d.weight"),
                &[pw, 1, self.conv],
                Fill::F32Uniform(-0.6, 0.6),
            ));
        }
        t.push(f32_tensor("o_norm.weight", &[d], Fill::F32Uniform(0.8, 1.2)));
        for s in ["q_proj", "k_proj", "v_proj"] {
            t.push(dense(&format!("{a}.{s}.weight"), pw, h, 1.0));
        }
        if self.variant == KimiVariant::K3 {
            t.push(dense(&format!("{a}.g_proj.weight"), pw, h, 1.0));
        } else {
            t.push(dense(&format!("{a}.g_a_proj.weight"), d, h, 1.0));
            t.push(dense(&format!("{a}.g_b_proj.weight"), pw, d, 1.0));
        }
        t.push(dense(&format!("{a}.f_a_proj.weight"), d, h, 1.0));
        t.push(dense(&format!("{a}.f_b_proj.weight"), pw, d, 1.0));
        t.push(dense(&format!("{a}.b_proj.weight"), heads, h, 1.0));
        t.push(dense(&format!("{a}.o_proj.weight"), h, pw, 1.0));
    }

    fn mla(&self, t: &mut Vec<(TensorSpec, Fill)>, p: &str) {
        let (h, a) = (self.hidden, format!("{p}.self_attn"));
        let qk = self.nope + self.rope;
        match self.q_lora {
            Some(r) => {
                t.push(dense(&format!("{a}.q_a_proj.weight"), r, h, 1.0));
                t.push(norm(&format!("{a}.q_a_layernorm.weight"), r));
                t.push(dense(&format!("{a}.q_b_proj.weight"), self.heads * qk, r, 1.0));
            }
            None => t.push(dense(&format!("{a}.q_proj.weight"), self.heads * qk, h, 1.0)),
        }
        t.push(dense(
            &format!("{a}.kv_a_proj_with_mqa.weight"),
            self.kv_lora + self.rope,
            h,
            1.0,
        ));
        t.push(norm(&format!("{a}.kv_a_layernorm.weight"), self.kv_lora));
        t.push(dense(
            &format!("{a}.kv_b_proj.weight"),
            self.heads * (self.nope + self.v),
            self.kv_lora,
            1.0,
        ));
        if self.variant == KimiVariant::K3 {
            t.push(dense(&format!("{a}.g_proj.weight"), self.heads * self.v, h, 1.0));
        }
        t.push(dense(&format!("{a}.o_proj.weight"), h, self.heads * self.v, 1.0));
    }

    fn moe(&self, t: &mut Vec<(TensorSpec, Fill)>, m: &str) {
        let h = self.hidden;
        t.push(dense(&format!("{m}.gate.weight"), self.experts, h, 1.0));
        let bias = TensorSpec::new(
            format!("{m}.gate.e_score_correction_bias"),
            Dtype::F32,
            &[self.experts],
        );
        t.push((bias, Fill::Bias));
        if self.variant == KimiVariant::K3 {
            t.push(dense(
                &format!("{m}.routed_expert_down_proj.weight"),
                self.latent,
                h,
                1.0,
            ));
            t.push(dense(
                &format!("{m}.routed_expert_up_proj.weight"),
                h,
                self.latent,
                1.0,
            ));
            t.push(norm(&format!("{m}.routed_expert_norm.weight"), self.latent));
        }
        for (name, rows, cols) in self.mlp_shapes(self.moe_intermediate * self.shared, h) {
            t.push(dense(
                &format!("{m}.shared_experts.{name}.weight"),
                rows,
                cols,
                1.0,
            ));
        }
        let input = if self.variant == KimiVariant::K3 {
            self.latent
        } else {
            h
        };
        let width = self.moe_intermediate;
        for e in 0..self.experts {
            for (w, rows, cols) in [("w1", width, input), ("w2", input, width), ("w3", width, input)] {
                let module = format!("{m}.experts.{e}.{w}");
                if self.variant == KimiVariant::K3 {
                    t.push((
                        TensorSpec::new(format!("{module}.weight_packed"), Dtype::U8, &[rows, cols / 2]),
                        Fill::Bytes,
                    ));
                    let scale =
                        TensorSpec::new(format!("{module}.weight_scale"), Dtype::U8, &[rows, cols / 32]);
                    t.push((scale, Fill::E8m0(e8m0_center(cols))));
                } else {
                    t.push(dense(&format!("{module}.weight"), rows, cols, 1.0));
                }
            }
        }
    }

    /// Bytes of tensor data in the checkpoint.
    pub fn data_bytes(&self) -> u64 {
        self.tensors().iter().map(|(t, _)| t.nbytes() as u64).sum()
    }

    /// Bytes of one routed expert (its `w1`/`w2`/`w3` tensors; 0 without MoE layers).
    pub fn expert_bytes(&self) -> u64 {
        if self.first_dense >= self.layers {
            return 0;
        }
        let prefix = self.name(&format!(
            "model.layers.{}.block_sparse_moe.experts.0.",
            self.first_dense
        ));
        self.tensors()
            .iter()
            .filter(|(t, _)| t.name.starts_with(&prefix))
            .map(|(t, _)| t.nbytes() as u64)
            .sum()
    }

    /// Routed experts in the checkpoint (all MoE layers).
    pub fn routed_experts(&self) -> u64 {
        (self.layers.saturating_sub(self.first_dense) * self.experts) as u64
    }

    /// Write the checkpoint (config, shards, index, tokenizer) into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        self.check()?;
        write_shards(dir, &self.tensors(), self.shards, self.seed)?;
        let flavor = if self.variant == KimiVariant::K3 {
            TokenizerFlavor::K3
        } else {
            TokenizerFlavor::K2
        };
        write_byte_tokenizer_flavor(dir, flavor)?;
        let config = serde_json::to_string_pretty(&self.config()).expect("json");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }

    fn check(&self) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidArgument {
                field: "synth",
                reason,
            })
        };
        if self.variant == KimiVariant::K3
            && (!self.latent.is_multiple_of(32) || !self.moe_intermediate.is_multiple_of(32))
        {
            return bad("MXFP4 experts need latent and moe_intermediate divisible by 32".into());
        }
        if self.full_attn_layers.iter().any(|&l| l == 0 || l > self.layers) {
            return bad(format!(
                "full_attn_layers {:?} must be one-based layers of 1..={}",
                self.full_attn_layers, self.layers
            ));
        }
        Ok(())
    }
}

/// The compressed-tensors MXFP4 config exactly as K3 ships it.
fn mxfp4_quantization() -> Value {
    json!({
        "format": "mxfp4-pack-quantized", "quant_method": "compressed-tensors", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
            "weights": {"group_size": 32, "num_bits": 4, "dynamic": false, "symmetric": true, "observer": "minmax",
                "scale_dtype": "torch.uint8", "strategy": "group", "type": "float", "actorder": null}}},
        "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
            "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
    })
}

/// E8M0 exponent giving elements of RMS about `1 / sqrt(cols)` (E2M1 values have RMS ≈ 2.93).
pub(crate) fn e8m0_center(cols: usize) -> u8 {
    let scale = 1.0 / (2.93 * (cols as f64).sqrt());
    (127.0 + scale.log2().round()) as u8
}
