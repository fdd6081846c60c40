//! Qwen3 dense (HF `transformers/models/qwen3/modeling_qwen3.py`), the raw-completion drafter.
//!
//! Per layer: `x += o_proj(attn(RMSNorm(x)))`, `x += down(silu(gate(·)) · up(·))(RMSNorm(x))`.
//! Attention is grouped-query: `q_proj`/`k_proj`/`v_proj`, a per-head RMSNorm of queries and
//! keys (`q_norm`, `k_norm`, over `head_dim`), `rotate_half` RoPE, causal softmax with scale
//! `head_dim^-0.5`, query head `h` reading key/value head `h / (heads / kv_heads)`. The cache
//! holds every position's rotated keys and values ([`KvCache`]). Tied embeddings when
//! configured. Traced tensors: `embed`, `layers.{l}`, `norm`.

use super::layers::gqa::{Gqa, GqaDims, GqaOptions, KvRows};
use super::layers::mlp::{Activation, Mlp};
use super::{Model, ModelInfo, RowPlan, SeqInput, StateSize, Trace, begin_pass, foreign_state};
use crate::backend::matmul;
use crate::config::Qwen3Config;
use crate::error::Result;
use crate::generate::{KvCache, LayerState, SeqState};
use crate::kernels::Matrix;
use crate::kernels::ops::rms_norm_inplace;
use crate::kernels::reference::decode_row;
use crate::model::Loader;

#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    attn: Gqa,
    post_norm: Vec<f32>,
    mlp: Mlp,
}

/// Sequence-state bytes: every layer caches per-head keys and values.
pub(crate) fn state_size(cfg: &Qwen3Config) -> StateSize {
    StateSize {
        per_token: (cfg.num_hidden_layers * 4 * 2 * cfg.num_key_value_heads * cfg.head_dim) as u64,
        per_sequence: 0,
    }
}

/// A loaded Qwen3 model.
#[derive(Debug)]
pub struct Qwen3 {
    cfg: Qwen3Config,
    info: ModelInfo,
    embed: Matrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Matrix,
}

fn load_layer(cfg: &Qwen3Config, ld: &Loader<'_>, i: usize) -> Result<Layer> {
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let p = format!("model.layers.{i}");
    let dims = GqaDims {
        heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
        head_dim: d,
        rotary_dim: d,
    };
    let opts = GqaOptions {
        qkv_bias: false,
        o_bias: false,
        qk_norm: true,
        eps: cfg.rms_norm_eps,
    };
    Ok(Layer {
        input_norm: ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
        attn: Gqa::load(ld, &format!("{p}.self_attn"), h, dims, &cfg.rope, opts)?,
        post_norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
        mlp: Mlp {
            gate: ld.linear(&format!("{p}.mlp.gate_proj"), cfg.intermediate_size, h)?,
            up: ld.linear(&format!("{p}.mlp.up_proj"), cfg.intermediate_size, h)?,
            down: ld.linear(&format!("{p}.mlp.down_proj"), h, cfg.intermediate_size)?,
            act: Activation::Silu,
        },
    })
}

impl super::Architecture for Qwen3Config {
    fn state_size(&self) -> StateSize {
        state_size(self)
    }

    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>> {
        Ok(Box::new(Qwen3::load(self.clone(), ld)?))
    }
}

impl Qwen3 {
    pub fn load(cfg: Qwen3Config, ld: &Loader<'_>) -> Result<Self> {
        let h = cfg.hidden_size;
        let embed = ld.dense("model.embed_tokens.weight", cfg.vocab_size, h)?;
        let lm_head = if cfg.tie_word_embeddings && !ld.has("lm_head.weight") {
            embed.clone()
        } else {
            ld.dense("lm_head.weight", cfg.vocab_size, h)?
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| load_layer(&cfg, ld, i))
            .collect::<Result<Vec<_>>>()?;
        let info = ModelInfo {
            arch: "qwen3",
            vocab_size: cfg.vocab_size,
            hidden_size: h,
            num_layers: cfg.num_hidden_layers,
            max_context: cfg.max_position_embeddings,
            bos_token_id: cfg.bos_token_id,
            eos_token_ids: cfg.eos_token_ids.clone(),
            weight_bytes: ld
                .index
                .names()
                .filter_map(|n| ld.index.info(n).ok())
                .map(|i| i.len)
                .sum(),
            state: state_size(&cfg),
        };
        Ok(Qwen3 {
            norm: ld.vector("model.norm.weight", h)?,
            cfg,
            info,
            embed,
            layers,
            lm_head,
        })
    }

    fn norm_rows(&self, x: &[f32], weight: &[f32]) -> Vec<f32> {
        let mut out = x.to_vec();
        out.chunks_mut(weight.len())
            .for_each(|r| rms_norm_inplace(r, weight, self.cfg.rms_norm_eps));
        out
    }
}

fn check_state(state: &SeqState, layers: usize) -> Result<()> {
    let ok = state.layers.len() == layers && state.layers.iter().all(|l| matches!(l, LayerState::Kv(_)));
    if ok { Ok(()) } else { Err(foreign_state()) }
}

impl Model for Qwen3 {
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        super::embed_tokens(&self.embed, tokens)
    }

    fn head(&self, normed: &[f32], rows: usize) -> Result<Vec<f32>> {
        super::head_logits(&self.lm_head, normed, rows)
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> SeqState {
        SeqState::new(
            (0..self.layers.len())
                .map(|_| LayerState::Kv(KvCache::default()))
                .collect(),
        )
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], mut trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        let h = self.cfg.hidden_size;
        let plan = RowPlan::new(batch, self.cfg.vocab_size, self.info.max_context)?;
        for b in batch.iter_mut() {
            check_state(b.state, self.layers.len())?;
        }
        begin_pass(batch);
        let n = plan.len();
        let mut x = vec![0.0f32; n * h];
        let tokens = batch.iter().flat_map(|b| b.tokens.iter().copied());
        for (row, t) in x.chunks_mut(h).zip(tokens) {
            decode_row(&self.embed, t as usize, row);
        }
        if let Some(t) = trace.as_deref_mut() {
            t.record("embed", &x);
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let xn = self.norm_rows(&x, &layer.input_norm);
            let mut caches: Vec<&mut KvCache> = batch
                .iter_mut()
                .map(|b| b.state.layers[l].kv_mut().expect("state checked: KV layer"))
                .collect();
            let mut rows = KvRows {
                caches: &mut caches,
                seq: &plan.seq,
                pos: &plan.pos,
            };
            let a = layer.attn.forward(&xn, n, &mut rows);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let xn = self.norm_rows(&x, &layer.post_norm);
            let f = layer.mlp.forward(&xn, n);
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("layers.{l}"), &x);
            }
        }
        let rows = plan.logit_rows(batch);
        let selected: Vec<f32> = rows
            .iter()
            .flat_map(|&r| x[r * h..(r + 1) * h].iter().copied())
            .collect();
        let normed = self.norm_rows(&selected, &self.norm);
        if let Some(t) = trace {
            t.record("norm", &normed);
        }
        let mut logits = vec![0.0f32; rows.len() * self.cfg.vocab_size];
        matmul(&self.lm_head, &normed, rows.len(), &mut logits);
        Ok(logits)
    }
}
