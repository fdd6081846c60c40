//! The multi-token-prediction (MTP) module a checkpoint publishes beside its decoder, run as a
//! drafter (the engine's `spec::mtp` proposer). HF `transformers` runs neither layout; the computation follows
//! the DeepSeek-V3 report §2.2 and vLLM's `DeepSeekMultiTokenPredictorLayer` /
//! `Qwen3NextMultiTokenPredictor`. Two published layouts ([`Layout`]):
//! - DeepSeek-V3, GLM-4.5, GLM-5: `model.layers.{L}` (`L = num_hidden_layers`) with `enorm`,
//!   `hnorm`, `eh_proj`, a decoder layer of the target's kind, `shared_head.{norm,head}` and its
//!   own `embed_tokens`; the row at position 0 gets a zero embedding (as vLLM does);
//! - Qwen3-Next / Qwen3.5 (`mtp_num_hidden_layers: 1`): `mtp.pre_fc_norm_embedding`,
//!   `mtp.pre_fc_norm_hidden`, `mtp.fc`, a full-attention decoder layer `mtp.layers.0`, and
//!   `mtp.norm`, with the target's embedding and head.
//!
//! In both:
//! - row at position `t`: `x = fc([norm_e(e), norm_h(h)])`, with `e` the embedding row of token
//!   `t + 1` and `h` the target's final-normed hidden row of position `t`;
//! - the module's decoder layer (its own attention cache at the target's positions, its own
//!   experts);
//! - logits `head(norm(x))` predict token `t + 2`; a draft of `k` tokens feeds the output row
//!   back as the next `h`.
//!
//! DeepSeek-V4's module (`mtp.0.*`, DeepSeek's reference `MTPBlock`) works on the target's
//! hyper-connection streams instead ([`Fuse::Streams`]): `x_k = e_proj(enorm(e)) +
//! h_proj(hnorm(h_k))` for each stream `k` of the target's last-layer streams, one V4 block over
//! the streams (its own kind, `compress_ratios` after the last layer), then its own hyper head
//! and `norm` before the target's head; the output streams are the next step's `h`.
//!
//! Drafts are verified by the target, so this module can change how often a draft is accepted,
//! never the output. It is memory-mapped whole (under a budget the server reserves its bytes:
//! `arch::mtp_bytes`); its experts do not go through the out-of-core expert cache.

use super::super::layers::dsa::Selection;
use super::super::layers::hyper::HyperHead;
use super::super::layers::ops::Host;
use super::super::{Loader, LogitRows, RowPlan, SeqInput};
use super::{DecoderPlan, Layer, MixerKind, load_layer, new_state, run_mixer, stack};
use crate::cache::ExpertPass;
use crate::error::{Error, Result};
use crate::kernels::Matrix;
use crate::kernels::ops::{rms_norm, rms_norm_rows};
use crate::kernels::reference::decode_row;
use crate::state::SeqState;

/// Where a published MTP module's tensors are.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The decoder layer's root, read as `model.layers.{L}` (`None`: it is there already).
    layer: Option<&'static str>,
    fc: &'static str,
    norm_e: &'static str,
    norm_h: &'static str,
    head_norm: &'static str,
    /// The module's own head and embedding (`None`: the target's `lm_head` and embedding).
    head: Option<&'static str>,
    embed: Option<&'static str>,
    /// The row at position 0 gets a zero embedding.
    zero_first: bool,
}

impl Layout {
    /// DeepSeek-V3's names below `model.layers.{L}.`.
    const DEEPSEEK: Layout = Layout {
        layer: None,
        fc: "eh_proj",
        norm_e: "enorm.weight",
        norm_h: "hnorm.weight",
        head_norm: "shared_head.norm.weight",
        head: Some("shared_head.head.weight"),
        embed: Some("embed_tokens.weight"),
        zero_first: true,
    };
    /// Qwen3-Next / Qwen3.5's names below `mtp.`.
    const QWEN: Layout = Layout {
        layer: Some("mtp.layers.0."),
        fc: "fc",
        norm_e: "pre_fc_norm_embedding.weight",
        norm_h: "pre_fc_norm_hidden.weight",
        head_norm: "norm.weight",
        head: None,
        embed: None,
        zero_first: false,
    };
}

/// How the module joins the next token's embedding with the target's hidden rows.
#[derive(Debug)]
enum Fuse {
    /// `fc([norm_e(e), norm_h(h)])` into one row (DeepSeek-V3, GLM, Qwen).
    Joined(Matrix),
    /// DeepSeek-V4: `e_proj(norm_e(e)) + h_proj(norm_h(h_k))` per stream, the block over the
    /// streams, then the module's hyper head.
    Streams {
        e_proj: Matrix,
        h_proj: Matrix,
        head: HyperHead,
        streams: usize,
    },
}

/// A loaded MTP module.
#[derive(Debug)]
pub struct MtpModule {
    /// The target's plan with the module's layer appended.
    plan: DecoderPlan,
    layer: Layer,
    embed: Matrix,
    enorm: Vec<f32>,
    hnorm: Vec<f32>,
    fuse: Fuse,
    /// The target's final norm (`model.norm`), applied to the captured target rows.
    final_norm: Vec<f32>,
    head_norm: Vec<f32>,
    head: Matrix,
    zero_first: bool,
}

impl MtpModule {
    /// The module of `plan`'s checkpoint, or `None` when it publishes none (no
    /// `model.layers.{L}.eh_proj` or `mtp.fc`).
    pub(crate) fn load(plan: &DecoderPlan, ld: &Loader<'_>) -> Result<Option<MtpModule>> {
        if plan.v4.is_some() {
            return Self::load_v4(plan, ld);
        }
        let l = plan.num_layers;
        let root = format!("model.layers.{l}.");
        let (layout, names) = if ld.has(&format!("{root}eh_proj.weight")) {
            (Layout::DEEPSEEK, root.clone())
        } else if ld.has("mtp.fc.weight") {
            (Layout::QWEN, "mtp.".to_string())
        } else {
            return Ok(None);
        };
        let (h, v) = (plan.hidden_size, plan.vocab_size);
        let mut plan = plan.clone();
        plan.num_layers += 1;
        plan.moe_layers.push(plan.moe.experts > 0);
        if !plan.mixers.is_empty() {
            // Qwen's module is a full-attention layer; DeepSeek's is the target's last kind.
            let kind = match layout.layer {
                Some(_) => MixerKind::Attention,
                None => plan.mixer(l - 1),
            };
            plan.mixers.push(kind);
        }
        if !plan.windows.is_empty() {
            plan.windows.push(None);
        }
        if plan.recurrent_shape(l).is_some() {
            return Err(Error::InvalidArgument {
                field: "mtp",
                reason: "an MTP layer with a recurrent mixer is not supported".into(),
            });
        }
        let layer = match layout.layer {
            Some(at) => load_layer(&plan, &ld.with_rename(&root, at), l)?,
            None => load_layer(&plan, ld, l)?,
        };
        let name = |n: &str| format!("{names}{n}");
        Ok(Some(MtpModule {
            embed: match layout.embed {
                Some(e) => ld.dense(&name(e), v, h)?,
                None => ld.dense("model.embed_tokens.weight", v, h)?,
            },
            enorm: plan.norm(ld, &name(layout.norm_e))?,
            hnorm: plan.norm(ld, &name(layout.norm_h))?,
            fuse: Fuse::Joined(ld.linear(&name(layout.fc), h, 2 * h)?),
            final_norm: plan.norm(ld, "model.norm.weight")?,
            head_norm: plan.norm(ld, &name(layout.head_norm))?,
            head: match layout.head {
                Some(n) => ld.dense(&name(n), v, h)?,
                None if plan.tie_word_embeddings && !ld.has("lm_head.weight") => {
                    ld.dense("model.embed_tokens.weight", v, h)?
                }
                None => ld.dense("lm_head.weight", v, h)?,
            },
            zero_first: layout.zero_first,
            layer,
            plan,
        }))
    }

    /// DeepSeek-V4's `mtp.0.*` block, or `None` when the checkpoint has none.
    fn load_v4(plan: &DecoderPlan, ld: &Loader<'_>) -> Result<Option<MtpModule>> {
        let (l, h, v) = (plan.num_layers, plan.hidden_size, plan.vocab_size);
        if !ld.has("mtp.0.e_proj.weight") {
            return Ok(None);
        }
        let (Some(v4), super::Residual::Hyper { streams, eps, .. }) = (&plan.v4, plan.residual) else {
            return Err(Error::InvalidArgument {
                field: "mtp",
                reason: "a DeepSeek-V4 MTP block needs the V4 plan".into(),
            });
        };
        let mut plan = plan.clone();
        plan.num_layers += 1;
        plan.moe_layers.push(true);
        plan.mixers.push(MixerKind::Compressed(v4.mtp_kind));
        let root = format!("layers.{l}.");
        let named = ld.with_naming(plan.naming());
        let module = named.with_rename(&root, "mtp.0.");
        let layer = load_layer(&plan, &module, l)?;
        let p = format!("model.layers.{l}");
        let name = |n: &str| format!("{p}.{n}");
        Ok(Some(MtpModule {
            embed: named.dense("model.embed_tokens.weight", v, h)?,
            enorm: plan.norm(&module, &name("enorm.weight"))?,
            hnorm: plan.norm(&module, &name("hnorm.weight"))?,
            fuse: Fuse::Streams {
                e_proj: module.linear(&name("e_proj"), h, h)?,
                h_proj: module.linear(&name("h_proj"), h, h)?,
                head: HyperHead::load(&module, &name("hc_head"), (streams, h), (eps, plan.rms_norm_eps))?,
                streams,
            },
            final_norm: Vec::new(),
            head_norm: plan.norm(&module, &name("norm.weight"))?,
            head: named.dense("lm_head.weight", v, h)?,
            zero_first: false,
            layer,
            plan,
        }))
    }

    /// Values per captured target row: the hidden size, or all hyper-connection streams (V4).
    pub fn row_width(&self) -> usize {
        match self.fuse {
            Fuse::Streams { streams, .. } => streams * self.plan.hidden_size,
            Fuse::Joined(_) => self.plan.hidden_size,
        }
    }

    /// The target trace tensor the module reads: the hidden rows after the target's last layer.
    pub fn capture(&self) -> String {
        format!("layers.{}", self.plan.num_layers - 2)
    }

    /// Hidden and vocabulary sizes.
    pub fn dims(&self) -> (usize, usize) {
        (self.plan.hidden_size, self.plan.vocab_size)
    }

    /// A fresh cache for the module's layer.
    pub fn new_state(&self) -> SeqState {
        let mut all = new_state(&self.plan);
        let last = all.layers.pop().expect("the plan has the module's layer");
        SeqState::new(vec![last])
    }

    /// The target's final norm over raw captured rows (`hidden` values each; V4's streams are
    /// normalised per stream inside [`MtpModule::forward`]).
    pub fn target_rows(&self, raw: &[f32]) -> Vec<f32> {
        if matches!(self.fuse, Fuse::Streams { .. }) {
            return raw.to_vec();
        }
        rms_norm_rows(
            raw,
            &self.final_norm,
            self.plan.rms_norm_eps,
            self.plan.hidden_size,
        )
    }

    /// Rows at positions `state.len()..` for `tokens` (each the token after its position) and
    /// `prev` hidden rows: the output rows (the next step's `prev`) and the logits of the last.
    pub fn forward(
        &self,
        state: &mut SeqState,
        tokens: &[u32],
        prev: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        match &self.fuse {
            Fuse::Joined(eh_proj) => self.forward_joined(eh_proj, state, tokens, prev),
            Fuse::Streams {
                e_proj,
                h_proj,
                head,
                streams,
            } => self.forward_streams((e_proj, h_proj, head, *streams), state, tokens, prev),
        }
    }

    /// `enorm` of each token's embedding, `n · hidden` values (the zero embedding at position 0
    /// where the module says so); token ids outside the vocabulary are refused.
    fn normed_embeddings(&self, tokens: &[u32], start: usize) -> Result<Vec<f32>> {
        let (h, eps) = (self.plan.hidden_size, self.plan.rms_norm_eps);
        let mut out = vec![0.0f32; tokens.len() * h];
        let mut e = vec![0.0f32; h];
        for (i, (row, &t)) in out.chunks_mut(h).zip(tokens).enumerate() {
            if t as usize >= self.embed.rows {
                return Err(Error::InvalidArgument {
                    field: "tokens",
                    reason: format!("token id {t} is outside the vocabulary"),
                });
            }
            match start + i {
                0 if self.zero_first => e.fill(0.0),
                _ => decode_row(&self.embed, t as usize, &mut e),
            }
            rms_norm(&e, &self.enorm, eps, row);
        }
        Ok(out)
    }

    /// The logits of one output row: `head(head_norm(row))`.
    fn logits(&self, row: &[f32]) -> Vec<f32> {
        let mut last = vec![0.0f32; self.plan.hidden_size];
        rms_norm(row, &self.head_norm, self.plan.rms_norm_eps, &mut last);
        let mut logits = vec![0.0f32; self.plan.vocab_size];
        crate::backend::matmul(&self.head, &last, 1, &mut logits);
        logits
    }

    /// [`MtpModule::forward`] for one hidden row per token: `eh_proj([enorm(e), hnorm(h)])`.
    fn forward_joined(
        &self,
        eh_proj: &Matrix,
        state: &mut SeqState,
        tokens: &[u32],
        prev: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (h, n, eps) = (self.plan.hidden_size, tokens.len(), self.plan.rms_norm_eps);
        if n == 0 || prev.len() != n * h {
            return Err(Error::InvalidArgument {
                field: "mtp",
                reason: format!("{n} tokens with {} hidden values", prev.len()),
            });
        }
        let e = self.normed_embeddings(tokens, state.len())?;
        let mut joined = vec![0.0f32; n * 2 * h];
        for (i, row) in joined.chunks_mut(2 * h).enumerate() {
            let (a, b) = row.split_at_mut(h);
            a.copy_from_slice(&e[i * h..][..h]);
            rms_norm(&prev[i * h..][..h], &self.hnorm, eps, b);
        }
        let mut x = vec![0.0f32; n * h];
        crate::backend::matmul(eh_proj, &joined, n, &mut x);
        self.run_layer(state, tokens, &mut x)?;
        let logits = self.logits(&x[(n - 1) * h..]);
        Ok((x, logits))
    }

    /// [`MtpModule::forward`] for V4: `prev` holds each row's target streams.
    fn forward_streams(
        &self,
        (e_proj, h_proj, head, streams): (&Matrix, &Matrix, &HyperHead, usize),
        state: &mut SeqState,
        tokens: &[u32],
        prev: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (h, n, eps) = (self.plan.hidden_size, tokens.len(), self.plan.rms_norm_eps);
        let width = streams * h;
        if n == 0 || prev.len() != n * width {
            return Err(Error::InvalidArgument {
                field: "mtp",
                reason: format!("{n} tokens with {} stream values", prev.len()),
            });
        }
        let e = self.normed_embeddings(tokens, state.len())?;
        let mut pe = vec![0.0f32; n * h];
        crate::backend::matmul(e_proj, &e, n, &mut pe);
        let hn = rms_norm_rows(prev, &self.hnorm, eps, h);
        let mut x = vec![0.0f32; n * width];
        crate::backend::matmul(h_proj, &hn, n * streams, &mut x);
        for (row, pe) in x.chunks_mut(width).zip(pe.chunks(h)) {
            for s in row.chunks_mut(h) {
                s.iter_mut().zip(pe).for_each(|(v, p)| *v += p);
            }
        }
        let rows = module_rows(state, n);
        let mut batch = [SeqInput {
            state,
            tokens,
            logits: LogitRows::Last,
        }];
        let layer = super::hyper::StreamLayer {
            layer: &self.layer,
            eps,
            hidden: h,
        };
        if let Err(e) = layer.run(&mut batch, (&rows, 0), tokens, &ExpertPass::open(None), &mut x) {
            batch[0].state.rollback();
            return Err(e);
        }
        batch[0].state.commit_all();
        let mut collapsed = vec![0.0f32; h];
        head.collapse(&x[(n - 1) * width..], &mut collapsed);
        let logits = self.logits(&collapsed);
        Ok((x, logits))
    }

    /// The module's decoder layer over `x`, appending its rows to `state`.
    fn run_layer(&self, state: &mut SeqState, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let (h, n, eps) = (self.plan.hidden_size, tokens.len(), self.plan.rms_norm_eps);
        let norm = |x: &[f32], w: &[f32]| rms_norm_rows(x, w, eps, h);
        let rows = module_rows(state, n);
        let mut batch = [SeqInput {
            state,
            tokens,
            logits: LogitRows::Last,
        }];
        let xn = norm(x, &self.layer.input_norm);
        let a = run_mixer(
            &self.layer.mixer,
            &xn,
            &mut batch,
            (&rows, 0),
            &mut Selection::new(),
        );
        x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
        let xn = norm(x, &self.layer.post_norm);
        let f = match stack::ffn(
            &Host,
            &self.layer.ffn,
            (&ExpertPass::open(None), 0),
            &xn,
            (n, &[]),
        ) {
            Ok(f) => f,
            Err(e) => {
                batch[0].state.rollback();
                return Err(e);
            }
        };
        x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
        batch[0].state.commit_all();
        Ok(())
    }
}

/// The module's `n` rows after what `state` holds, as one sequence; begins their pass.
fn module_rows(state: &mut SeqState, n: usize) -> RowPlan {
    let start = state.len();
    state.begin_pass(n);
    RowPlan {
        seq: vec![0; n],
        pos: (start..start + n).collect(),
    }
}
