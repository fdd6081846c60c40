//! A DSpark-style block draft head (the Kimi K3 draft of `reference/kimi-k3.md` §5.4).
//!
//! * **Context.** For every committed target position the hidden rows after the configured
//!   target layers (`target_layer_ids`, captured from the target's pass as `layers.{l}`) are
//!   concatenated and projected: `c = RMSNorm_context_norm(context_proj · row)`. Each draft layer
//!   turns `c` into one cache entry with its own `kv_a_proj_with_mqa` (RMS-normalised latent and
//!   a YaRN-rotated shared key at the target position) — the draft's cache positions are the
//!   target's.
//! * **Proposal.** The query is one block of `block_size` rows: the pending target token (the
//!   anchor) then mask tokens, at positions `len … len + block_size − 1`, embedded with the
//!   **target's** embedding rows (the checkpoint's own `embed_tokens` copy is never loaded).
//!   Each layer is pre-norm MLA (low-rank queries, absorbed latent attention over every cached
//!   context position and every row of the block — no causal mask inside the block; block rows
//!   are not cached) and a SiLU-gated MLP. The final-normed rows go through the **target's**
//!   `lm_head`; a rank-`r` Markov head adds `markov_w2 · markov_w1[prev]` to each row's logits and
//!   the draft token of row `i` is the argmax, with `prev` the token chosen for the row before
//!   (the anchor for row 0).
//!
//! The reference runs the draft's residual stream in BF16; this one runs it in f32 like every
//! other activation here. Drafts are verified, so the numeric mode of the draft changes only how
//! often it is right, never the output.

mod config;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use config::DSparkConfig;

use super::{Observation, Proposal, Proposer, ProposerKind};
use crate::arch::{Loader, Model};
use crate::backend::matmul;
use crate::config::Quantization;
use crate::error::{Error, Result};
use crate::kernels::Matrix;
use crate::kernels::ops::{argmax, rms_norm_inplace, rms_norm_rows};
use crate::model::layers::mla::{Mla, MlaDims};
use crate::model::layers::mlp::{Activation, Mlp};
use crate::model::layers::rope::Rope;
use crate::state::MlaCache;
use crate::weights::WeightIndex;

/// One draft decoder layer.
#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    attn: Mla,
    post_norm: Vec<f32>,
    mlp: Mlp,
}

/// The loaded draft head (shared by every request).
#[derive(Debug)]
pub struct DSpark {
    cfg: DSparkConfig,
    dir: PathBuf,
    context_proj: Matrix,
    context_norm: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    markov_in: Matrix,
    markov_out: Matrix,
    captures: Vec<String>,
}

fn load_layer(cfg: &DSparkConfig, ld: &Loader<'_>, i: usize) -> Result<Layer> {
    let (h, qk) = (cfg.hidden_size, cfg.qk_head_dim());
    let p = format!("layers.{i}");
    let dims = MlaDims {
        heads: cfg.heads,
        nope: cfg.nope,
        rope: cfg.rope,
        v: cfg.v,
        kv_lora: cfg.kv_lora_rank,
        eps: cfg.eps,
        scale: ((qk as f64).powf(-0.5) * cfg.rope_config.softmax_scale_multiplier()) as f32,
    };
    let rotary = Some(Rope::new(&cfg.rope_config, cfg.rope, cfg.rope_interleave));
    let attn = Mla::load(
        ld,
        &format!("{p}.self_attn"),
        h,
        cfg.q_lora_rank,
        dims,
        rotary,
        None,
    )?;
    let mlp = Mlp::split(
        ld.linear(&format!("{p}.mlp.gate_proj"), cfg.intermediate_size, h)?,
        ld.linear(&format!("{p}.mlp.up_proj"), cfg.intermediate_size, h)?,
        ld.linear(&format!("{p}.mlp.down_proj"), h, cfg.intermediate_size)?,
        Activation::Silu,
    );
    Ok(Layer {
        input_norm: ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
        attn,
        post_norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
        mlp,
    })
}

impl DSpark {
    /// Load the draft head in `dir` (`config.json` + safetensors).
    pub fn load(dir: &Path) -> Result<DSpark> {
        let cfg = DSparkConfig::load(dir)?;
        let index = WeightIndex::open(dir)?;
        let quant = Quantization::None;
        let ld = Loader::with_layout(&index, "", &quant);
        let h = cfg.hidden_size;
        let layers = (0..cfg.num_layers)
            .map(|i| load_layer(&cfg, &ld, i))
            .collect::<Result<Vec<_>>>()?;
        let captured = cfg.target_layer_ids.len() * cfg.target_hidden_size;
        // The confidence head is part of the format; it is checked but not used.
        index.expect(
            "confidence.weight",
            &[crate::weights::Dtype::BF16, crate::weights::Dtype::F32],
            &[1, h + cfg.markov_rank],
        )?;
        Ok(DSpark {
            context_proj: ld.linear("context_proj", h, captured)?,
            context_norm: ld.vector("context_norm.weight", h)?,
            norm: ld.vector("norm.weight", h)?,
            markov_in: ld.dense("markov_w1.weight", cfg.vocab_size, cfg.markov_rank)?,
            markov_out: ld.dense("markov_w2.weight", cfg.vocab_size, cfg.markov_rank)?,
            captures: cfg.capture_names(),
            layers,
            dir: dir.to_path_buf(),
            cfg,
        })
    }

    /// The validated config.
    pub fn config(&self) -> &DSparkConfig {
        &self.cfg
    }

    /// Check that this head was made for `target`: hidden sizes, vocabulary, captured layers.
    pub fn check_target(&self, target: &dyn Model) -> Result<()> {
        let info = target.info();
        let c = &self.cfg;
        let bad = |field: &str, reason: String| Error::config(self.dir.join("config.json"), field, reason);
        if c.target_hidden_size != info.hidden_size || c.hidden_size != info.hidden_size {
            return Err(bad(
                "hidden_size",
                format!("the target's hidden size is {}", info.hidden_size),
            ));
        }
        if c.vocab_size != info.vocab_size {
            return Err(bad(
                "vocab_size",
                format!("the target's vocabulary has {} entries", info.vocab_size),
            ));
        }
        if let Some(l) = c.target_layer_ids.iter().find(|&&l| l >= info.num_layers) {
            return Err(bad(
                "target_layer_ids",
                format!(
                    "layer {l} does not exist: the target has {} layers",
                    info.num_layers
                ),
            ));
        }
        Ok(())
    }

    /// A proposer for one request over `target` (call [`DSpark::check_target`] once first).
    pub fn session(self: &Arc<Self>, max_context: usize) -> DSparkSession {
        let caches = (0..self.layers.len()).map(|_| MlaCache::default()).collect();
        DSparkSession {
            head: self.clone(),
            caches,
            len: 0,
            max_context,
            pending: vec![Vec::new(); self.captures.len()],
            pending_rows: 0,
        }
    }

    /// Append committed positions `start..start + rows` to `caches` from their captured rows:
    /// `parts[c]` holds `rows` rows of capture `c` (in `target_layer_ids` order). One multi-row
    /// pass; batch invariance makes it bit-identical to appending the rows one at a time.
    fn extend_context(
        &self,
        caches: &mut [MlaCache],
        start: usize,
        rows: usize,
        parts: &[&[f32]],
    ) -> Result<()> {
        let (w, h) = (self.cfg.target_hidden_size, self.cfg.hidden_size);
        if parts.len() != self.captures.len() || parts.iter().any(|p| p.len() != rows * w) {
            return Err(Error::InvalidArgument {
                field: "dspark",
                reason: "captured target rows are missing".into(),
            });
        }
        let k = parts.len() * w;
        let mut input = vec![0.0f32; rows * k];
        for (r, dst) in input.chunks_mut(k).enumerate() {
            for (part, d) in parts.iter().zip(dst.chunks_mut(w)) {
                d.copy_from_slice(&part[r * w..(r + 1) * w]);
            }
        }
        let mut ctx = vec![0.0f32; rows * h];
        matmul(&self.context_proj, &input, rows, &mut ctx);
        ctx.chunks_mut(h)
            .for_each(|out| rms_norm_inplace(out, &self.context_norm, self.cfg.eps));
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            layer.attn.append_context(cache, &ctx, rows, start);
        }
        Ok(())
    }

    /// The block's first `rows` rows after `anchor` at position `len`: their logits with the
    /// Markov bias added (`rows × vocab`) and the draft tokens (the argmax of each).
    fn block(
        &self,
        target: &dyn Model,
        caches: &[MlaCache],
        len: usize,
        anchor: u32,
        rows: usize,
    ) -> Result<(Vec<f32>, Vec<u32>)> {
        let (h, b) = (self.cfg.hidden_size, self.cfg.block_size);
        let mut tokens = vec![self.cfg.mask_token_id; b];
        tokens[0] = anchor;
        let mut x = target.embed(&tokens)?;
        for (layer, cache) in self.layers.iter().zip(caches) {
            let xn = rms_norm_rows(&x, &layer.input_norm, self.cfg.eps, h);
            let a = layer.attn.forward_block(&xn, b, cache, len);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let xn = rms_norm_rows(&x, &layer.post_norm, self.cfg.eps, h);
            let f = layer.mlp.forward(&xn, b);
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
        }
        let rows = rows.min(b);
        let normed = rms_norm_rows(&x[..rows * h], &self.norm, self.cfg.eps, h);
        let mut logits = target.head(&normed, rows)?;
        let vocab = self.cfg.vocab_size;
        let mut prev = anchor;
        let mut code = vec![0.0f32; self.cfg.markov_rank];
        let mut bias = vec![0.0f32; vocab];
        let mut out = Vec::with_capacity(rows);
        for row in logits.chunks_mut(vocab) {
            crate::kernels::reference::decode_row(&self.markov_in, prev as usize, &mut code);
            matmul(&self.markov_out, &code, 1, &mut bias);
            row.iter_mut().zip(&bias).for_each(|(l, b)| *l += b);
            prev = argmax(row) as u32;
            out.push(prev);
        }
        Ok((logits, out))
    }
}

/// Committed rows a session buffers before adding them to its context in one pass (unless a
/// proposal needs them first). Bounds the buffer to this many rows of every capture.
const FLUSH_ROWS: usize = 64;

/// One request's draft state: the context caches of its committed positions.
///
/// Committed rows are buffered and added to the caches in one multi-row pass when the next
/// proposal needs them (or every [`FLUSH_ROWS`] rows). While the economics gate has drafting
/// off, the rows of many steps are thus projected together, reading the head's weights once
/// instead of once per step; the caches end up bit-identical either way.
#[derive(Debug)]
pub struct DSparkSession {
    head: Arc<DSpark>,
    caches: Vec<MlaCache>,
    /// Committed positions in the caches.
    len: usize,
    /// Positions beyond which the head is not used (its trained context).
    max_context: usize,
    /// Captured rows of positions `len..len + pending_rows`, one buffer per capture.
    pending: Vec<Vec<f32>>,
    pending_rows: usize,
}

impl DSparkSession {
    /// The whole block after `anchor` (the pending token at the next position): every row's
    /// logits with the Markov bias (`block_size × vocab`) and its draft token. For tests and
    /// diagnostics; proposing uses the same computation.
    pub fn block(&mut self, target: &dyn Model, anchor: u32) -> Result<(Vec<f32>, Vec<u32>)> {
        self.flush()?;
        self.head
            .block(target, &self.caches, self.len, anchor, self.head.cfg.block_size)
    }

    /// Committed positions observed so far (in the caches or buffered).
    pub fn observed(&self) -> usize {
        self.len + self.pending_rows
    }

    /// Add the buffered rows to the caches.
    fn flush(&mut self) -> Result<()> {
        if self.pending_rows == 0 {
            return Ok(());
        }
        let parts: Vec<&[f32]> = self.pending.iter().map(Vec::as_slice).collect();
        self.head
            .extend_context(&mut self.caches, self.len, self.pending_rows, &parts)?;
        self.len += self.pending_rows;
        self.pending_rows = 0;
        self.pending.iter_mut().for_each(Vec::clear);
        Ok(())
    }
}

impl Proposer for DSparkSession {
    fn kind(&self) -> ProposerKind {
        ProposerKind::Dspark
    }

    fn captures(&self) -> &[String] {
        &self.head.captures
    }

    fn catch_up(&mut self, _target: &dyn Model) -> Result<()> {
        self.flush()
    }

    fn propose(&mut self, target: &dyn Model, history: &[u32], max: usize) -> Result<Proposal> {
        let Some(&anchor) = history.last() else {
            return Ok(Proposal::default());
        };
        self.flush()?;
        if self.len + 1 != history.len() {
            return Err(Error::InvalidArgument {
                field: "dspark",
                reason: format!(
                    "draft context has {} positions, the sequence {}",
                    self.len,
                    history.len() - 1
                ),
            });
        }
        if self.len + self.head.cfg.block_size > self.max_context {
            return Ok(Proposal::default());
        }
        Ok(Proposal::new(
            self.head.block(target, &self.caches, self.len, anchor, max)?.1,
        ))
    }

    fn observe(&mut self, _target: &dyn Model, obs: &Observation<'_>) -> Result<()> {
        let n = obs.tokens.len();
        if obs.start != self.observed() {
            // Positions the draft never saw (a reused conversation state): it cannot catch up.
            return Err(Error::InvalidArgument {
                field: "dspark",
                reason: format!(
                    "committed rows start at {} but the draft context has {}",
                    obs.start,
                    self.observed()
                ),
            });
        }
        if self.observed() + n > self.max_context {
            return Err(Error::InvalidArgument {
                field: "dspark",
                reason: "the context outgrew the draft head".into(),
            });
        }
        let w = self.head.cfg.target_hidden_size;
        let rows: Vec<&[f32]> = self
            .head
            .captures
            .iter()
            .map(|name| {
                let found = obs.hidden.iter().find(|(got, _)| got == name);
                found.map_or(&[][..], |(_, v)| v.as_slice())
            })
            .collect();
        if rows.iter().any(|r| r.len() != n * w) {
            return Err(Error::InvalidArgument {
                field: "dspark",
                reason: "captured target rows are missing".into(),
            });
        }
        for (buf, r) in self.pending.iter_mut().zip(rows) {
            buf.extend_from_slice(r);
        }
        self.pending_rows += n;
        if self.pending_rows >= FLUSH_ROWS {
            self.flush()?;
        }
        Ok(())
    }
}
