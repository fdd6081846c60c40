//! Synthetic DSpark draft heads in the real checkpoint format (`config.json` with
//! `architectures: ["K3DSparkModel"]`, one BF16 `model.safetensors` with the 12 tensors per
//! layer, `context_proj`, `context_norm`, `norm`, the Markov and confidence heads and the
//! duplicate `embed_tokens` that the loader never reads), shaped for a given target.

use std::path::Path;

use serde_json::{Value, json};

use super::fill::{Fill, dense, norm, write_shards};
use crate::arch::ModelInfo;
use crate::error::Result;
use crate::weights::{Dtype, TensorSpec, write_atomic};

/// Shape of a synthetic draft head.
#[derive(Debug, Clone)]
pub struct DSparkSynth {
    pub hidden: usize,
    pub vocab: usize,
    pub target_layer_ids: Vec<usize>,
    pub layers: usize,
    pub heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub intermediate: usize,
    pub block_size: usize,
    pub markov_rank: usize,
    pub mask_token_id: u32,
    pub seed: u64,
}

impl DSparkSynth {
    /// A tiny head for `target`: two layers reading the target's first, middle and last layers.
    pub fn for_target(target: &ModelInfo, seed: u64) -> Self {
        let l = target.num_layers;
        let mut ids = vec![0, l / 2, l - 1];
        ids.dedup();
        DSparkSynth {
            hidden: target.hidden_size,
            vocab: target.vocab_size,
            target_layer_ids: ids,
            layers: 2,
            heads: 2,
            q_lora_rank: 16,
            kv_lora_rank: 16,
            nope: 8,
            rope: 8,
            v: 8,
            intermediate: 2 * target.hidden_size,
            block_size: 5,
            markov_rank: 8,
            mask_token_id: (target.vocab_size - 1) as u32,
            seed,
        }
    }

    /// The `config.json` document.
    pub fn config(&self) -> Value {
        json!({
            "architectures": ["K3DSparkModel"],
            "model_type": "k3_dspark",
            "_torchspec_version": "0.1.0",
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.nope,
            "qk_rope_head_dim": self.rope,
            "v_head_dim": self.v,
            "rms_norm_eps": 1e-6,
            "rope_theta": 50000.0,
            "rope_scaling": {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 32768,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
            "max_position_embeddings": 1048576,
            "vocab_size": self.vocab,
            "target_layer_ids": self.target_layer_ids,
            "target_hidden_size": self.hidden,
            "mask_token_id": self.mask_token_id,
            "block_size": self.block_size,
            "markov_rank": self.markov_rank,
            "hidden_act": "silu",
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
        })
    }

    fn tensors(&self) -> Vec<(TensorSpec, Fill)> {
        let h = self.hidden;
        let qk = self.nope + self.rope;
        let mut t = vec![
            dense("context_proj.weight", h, self.target_layer_ids.len() * h, 1.0),
            norm("context_norm.weight", h),
            (
                TensorSpec::new("embed_tokens.weight", Dtype::BF16, &[self.vocab, h]),
                Fill::Uniform(-0.1, 0.1),
            ),
            dense("markov_w1.weight", self.vocab, self.markov_rank, 1.0),
            dense("markov_w2.weight", self.vocab, self.markov_rank, 1.0),
            dense("confidence.weight", 1, h + self.markov_rank, 1.0),
            (
                TensorSpec::new("confidence.bias", Dtype::BF16, &[1]),
                Fill::Uniform(-0.1, 0.1),
            ),
            norm("norm.weight", h),
        ];
        for i in 0..self.layers {
            let p = format!("layers.{i}");
            let a = format!("{p}.self_attn");
            t.extend([
                norm(&format!("{p}.input_layernorm.weight"), h),
                dense(&format!("{a}.q_a_proj.weight"), self.q_lora_rank, h, 1.0),
                norm(&format!("{a}.q_a_layernorm.weight"), self.q_lora_rank),
                dense(
                    &format!("{a}.q_b_proj.weight"),
                    self.heads * qk,
                    self.q_lora_rank,
                    1.0,
                ),
                dense(
                    &format!("{a}.kv_a_proj_with_mqa.weight"),
                    self.kv_lora_rank + self.rope,
                    h,
                    1.0,
                ),
                norm(&format!("{a}.kv_a_layernorm.weight"), self.kv_lora_rank),
                dense(
                    &format!("{a}.kv_b_proj.weight"),
                    self.heads * (self.nope + self.v),
                    self.kv_lora_rank,
                    1.0,
                ),
                dense(&format!("{a}.o_proj.weight"), h, self.heads * self.v, 0.5),
                norm(&format!("{p}.post_attention_layernorm.weight"), h),
                dense(&format!("{p}.mlp.gate_proj.weight"), self.intermediate, h, 1.0),
                dense(&format!("{p}.mlp.up_proj.weight"), self.intermediate, h, 1.0),
                dense(&format!("{p}.mlp.down_proj.weight"), h, self.intermediate, 0.5),
            ]);
        }
        t
    }

    /// Write the head into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_shards(dir, &self.tensors(), 1, self.seed)?;
        let config = serde_json::to_string_pretty(&self.config()).expect("json");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }
}
