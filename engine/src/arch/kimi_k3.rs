//! Kimi K3: KDA (lower-bounded gate, per-channel `A_log`, full-rank output gate) and gated
//! NoPE-MLA layers, Block Attention Residuals, SiTU, a latent MoE with MXFP4 experts combined in
//! router order plus fused shared experts, untied head. Reference: `reference/kimi-k3.md` §1
//! (the independent float64 NumPy oracle of the golden test is written from the same text).
//!
//! Per position the state between layers is `(h, A)`: `h` the within-block running sum of
//! sub-layer outputs, `A` the completed block representations ("anchors"). Layer `ℓ`:
//! * `u = AttnRes_att([A…, h])` (just `h` while `A` is empty);
//! * if `ℓ % attn_res_block_size == 0`, `h` becomes an anchor and the partial sum `p` restarts
//!   (`p = a` below), otherwise `p = h`;
//! * `a = Attn(RMSNorm_in(u))`; `p ← p + a`; `m = AttnRes_mlp([A…, p])`;
//! * `h ← p + FFN(RMSNorm_post(m))`.
//!
//! Tail: `z = AttnRes_out([A…, h])`, `logits = lm_head(RMSNorm(z))`. Traced tensors: `embed`,
//! `layers.{ℓ}` (= `h` after layer ℓ) and `norm` (= `RMSNorm(z)` of the logit rows).
//!
//! Layers live in a [`LayerStore`]: all in memory ([`KimiK3::load`]) or, under a memory budget
//! ([`KimiK3::load_budgeted`], [`super::kimi_ooc`]), a resident prefix plus streamed layers,
//! with the MXFP4 routed experts served by the out-of-core [`ExpertStore`]; both build layers
//! and experts with the same code. The look-ahead prefetch applies layer `ℓ+1`'s
//! `post_attention_layernorm` and router to `m` of layer `ℓ` (deltafin's PILOT predictor).

use std::sync::Arc;

use super::ModelSpec;
use super::kimi_linear::{
    Attn, DeviceAttn, Ffn, Variant, check_state, embed_rows, head, load_attn, load_embed_head, load_ffn,
    model_info, new_layer_states, norm_rows, run_attn,
};
use super::layers::attn_res::AttnRes;
use super::layers::device;
use super::layers::kda::L2Norm;
use super::layers::mlp::Activation;
use super::layers::moe::{Combine, ExpertProvider};
use super::{Loader, Model, ModelInfo, RowPlan, SeqInput, StateSize, Trace, begin_pass};
use crate::backend::device::DeviceOps;
use crate::cache::ExpertPass;
use crate::cache::layers::LayerBuilder;
use crate::cache::{ExpertStore, LayerStore, OocOptions, OocRuntime};
use crate::config::{KimiK3Config, KimiLinearConfig};
use crate::error::Result;
use crate::kernels::Matrix;
use crate::state::SeqState;
use crate::weights::WeightIndex;

/// `F.normalize`'s floor on the L2 norm of q and k.
const L2_FLOOR: f32 = 1e-12;

#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn_res: AttnRes,
    mlp_res: AttnRes,
    attn: Attn,
    ffn: Ffn,
}

/// A loaded Kimi K3 model.
#[derive(Debug)]
pub struct KimiK3 {
    cfg: KimiK3Config,
    info: ModelInfo,
    embed: Matrix,
    layers: Arc<LayerStore<Layer>>,
    output_res: AttnRes,
    norm: Vec<f32>,
    lm_head: Matrix,
    /// Routed experts when they are not inside the layers (out-of-core mode).
    experts: Option<Arc<ExpertStore>>,
}

/// The always-resident tensors besides the look-ahead routers.
struct Fixed {
    embed: Matrix,
    lm_head: Matrix,
    output_res: AttnRes,
    norm: Vec<f32>,
}

/// The AttnRes site `{p}{site}_res_norm` / `{p}{site}_res_proj`.
fn load_res(ld: &Loader<'_>, p: &str, site: &str, h: usize, eps: f32) -> Result<AttnRes> {
    let norm = ld.vector(&format!("{p}{site}_res_norm.weight"), h)?;
    let proj = ld.floats(&format!("{p}{site}_res_proj.weight"), &[1, h])?;
    Ok(AttnRes::new(&norm, &proj, eps))
}

/// K3's choices of the shared Kimi layers.
fn variant(cfg: &KimiK3Config) -> Variant {
    Variant {
        act: Activation::Situ {
            beta: cfg.situ_beta,
            linear_beta: cfg.situ_linear_beta,
        },
        l2: L2Norm::EpsFloor(L2_FLOOR),
        mla_norm_eps: cfg.text.rms_norm_eps,
        mla_gate: cfg.mla_use_output_gate,
        latent: Some((cfg.routed_expert_hidden_size, cfg.latent_moe_use_norm)),
        combine: Combine::RouteOrder,
    }
}

/// Decoder layer `i` (without routed experts when the loader says so).
fn load_layer(t: &KimiLinearConfig, ld: &Loader<'_>, i: usize, v: &Variant) -> Result<Layer> {
    let (h, eps, p) = (t.hidden_size, t.rms_norm_eps, format!("model.layers.{i}."));
    Ok(Layer {
        input_norm: ld.vector(&format!("{p}input_layernorm.weight"), h)?,
        post_norm: ld.vector(&format!("{p}post_attention_layernorm.weight"), h)?,
        attn_res: load_res(ld, &p, "self_attention", h, eps)?,
        mlp_res: load_res(ld, &p, "mlp", h, eps)?,
        attn: load_attn(t, ld, i, v)?,
        ffn: load_ffn(t, ld, i, v)?,
    })
}

fn load_fixed(t: &KimiLinearConfig, ld: &Loader<'_>) -> Result<Fixed> {
    let (embed, lm_head) = load_embed_head(t, ld)?;
    Ok(Fixed {
        embed,
        lm_head,
        output_res: load_res(ld, "model.", "output_attn", t.hidden_size, t.rms_norm_eps)?,
        norm: ld.vector("model.norm.weight", t.hidden_size)?,
    })
}

impl super::Architecture for KimiK3Config {
    fn state_size(&self) -> StateSize {
        super::kimi_linear::state_size(&self.text)
    }

    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>> {
        Ok(Box::new(KimiK3::load(self.clone(), ld)?))
    }

    fn supports_budget(&self) -> bool {
        true
    }

    fn load_budgeted(
        &self,
        spec: &ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Box<dyn Model>, OocRuntime)> {
        let (model, runtime) = KimiK3::load_budgeted(self.clone(), spec, index, options)?;
        Ok((Box::new(model), runtime))
    }
}

impl KimiK3 {
    /// Load and shape-check every tensor.
    pub fn load(cfg: KimiK3Config, ld: &Loader<'_>) -> Result<Self> {
        let (t, v) = (&cfg.text, variant(&cfg));
        let Fixed {
            embed,
            lm_head,
            output_res,
            norm,
        } = load_fixed(t, ld)?;
        let layers = (0..t.num_hidden_layers)
            .map(|i| load_layer(t, ld, i, &v))
            .collect::<Result<Vec<_>>>()?;
        let info = model_info("kimi_k3", t, ld);
        let layers = Arc::new(LayerStore::resident(layers));
        Ok(KimiK3 {
            output_res,
            norm,
            embed,
            layers,
            lm_head,
            info,
            cfg,
            experts: None,
        })
    }

    /// Load under `options.budget` (see [`super::kimi_ooc`]): embeddings, head, final norm,
    /// output AttnRes and the look-ahead routers resident, a prefix of layers resident and the
    /// rest streamed each pass, the MXFP4 routed experts through the expert cache.
    /// Bit-identical to [`Self::load`].
    pub fn load_budgeted(
        cfg: KimiK3Config,
        spec: &ModelSpec,
        index: Arc<WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Self, OocRuntime)> {
        let (t, v) = (&cfg.text, variant(&cfg));
        let (lt, lv) = (t.clone(), v.clone());
        let layer: LayerBuilder<Layer> = Arc::new(move |ld, i| load_layer(&lt, ld, i, &lv));
        let b = super::kimi_ooc::load(t, &v, spec, index.clone(), options, |ld| load_fixed(t, ld), layer)?;
        let info = model_info("kimi_k3", t, &Loader::new(&index, spec));
        let experts = Some(b.runtime.experts.clone());
        let Fixed {
            embed,
            lm_head,
            output_res,
            norm,
        } = b.fixed;
        Ok((
            KimiK3 {
                output_res,
                norm,
                embed,
                layers: b.layers,
                lm_head,
                info,
                cfg,
                experts,
            },
            b.runtime,
        ))
    }
}

/// AttnRes over every row: `anchors[a]` and `last` hold `n` rows of `h` values each.
fn mix_rows(res: &AttnRes, anchors: &[Vec<f32>], last: &[f32], rows: &[usize], h: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows.len() * h];
    let mut refs: Vec<&[f32]> = Vec::with_capacity(anchors.len());
    for (k, &r) in rows.iter().enumerate() {
        refs.clear();
        refs.extend(anchors.iter().map(|a| &a[r * h..(r + 1) * h]));
        res.mix(&refs, &last[r * h..(r + 1) * h], &mut out[k * h..(k + 1) * h]);
    }
    out
}

impl Model for KimiK3 {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

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
        new_layer_states(&self.cfg.text)
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], mut trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        let t = &self.cfg.text;
        let (h, eps) = (t.hidden_size, t.rms_norm_eps);
        let plan = RowPlan::new(batch, t.vocab_size, self.info.max_context)?;
        for b in batch.iter_mut() {
            check_state(t, b.state)?;
        }
        begin_pass(batch);
        let run = embed_rows(&self.embed, batch, plan.len());
        if let Some(tr) = trace.as_deref_mut() {
            tr.record("embed", &run);
        }
        let (run, anchors) = match self.run_layers(batch, &plan, run, trace.as_deref_mut()) {
            Ok(r) => r,
            Err(e) => {
                batch.iter_mut().for_each(|b| b.state.rollback()); // a failed read leaves no trace
                return Err(e);
            }
        };
        let logit_rows = plan.logit_rows(batch);
        let z = mix_rows(&self.output_res, &anchors, &run, &logit_rows, h);
        let normed = norm_rows(&z, &self.norm, eps);
        if let Some(tr) = trace {
            tr.record("norm", &normed);
        }
        Ok(head(&self.lm_head, &normed, logit_rows.len()))
    }
}

impl KimiK3 {
    /// Every decoder layer from the embedding rows `run`; returns the final running sum `h`
    /// and the anchors. On error the caller rolls the states back.
    fn run_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        mut run: Vec<f32>,
        mut trace: Option<&mut Trace>,
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let t = &self.cfg.text;
        let (h, eps, block) = (t.hidden_size, t.rms_norm_eps, self.cfg.attn_res_block_size);
        let n = plan.len();
        let all: Vec<usize> = (0..n).collect();
        let mut anchors: Vec<Vec<f32>> = Vec::with_capacity(self.cfg.num_blocks());
        let pass = ExpertPass::open(self.experts.as_deref());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let u = if anchors.is_empty() {
                run.clone()
            } else {
                mix_rows(&layer.attn_res, &anchors, &run, &all, h)
            };
            let partial = if l % block == 0 {
                anchors.push(run);
                None
            } else {
                Some(run)
            };
            let a = run_attn(
                &layer.attn,
                &norm_rows(&u, &layer.input_norm, eps),
                plan,
                batch,
                l,
            );
            let p = match partial {
                None => a,
                Some(mut p) => {
                    p.iter_mut().zip(&a).for_each(|(p, a)| *p += a);
                    p
                }
            };
            let m = mix_rows(&layer.mlp_res, &anchors, &p, &all, h);
            // PILOT look-ahead (kimi-k3.md §4.5): layer l + 1's norm and router applied to the
            // AttnRes output that feeds this layer's FFN. A forecast for prefetching only;
            // layer l + 1 routes its own input.
            pass.hint_next(l, &m, n);
            let experts = pass.layer(l);
            let provider = experts.as_ref().map(|e| e as &dyn ExpertProvider);
            let f = layer
                .ffn
                .forward_with(&norm_rows(&m, &layer.post_norm, eps), n, provider)?;
            run = p;
            run.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            if let Some(tr) = trace.as_deref_mut() {
                tr.record(format!("layers.{l}"), &run);
            }
        }
        pass.finish()?;
        Ok((run, anchors))
    }
}

/// One decoder layer's device-resident constants and sequence state.
struct DeviceLayer<B> {
    input_norm: B,
    post_norm: B,
    attn_res: B,
    mlp_res: B,
    attn: DeviceAttn<B>,
    bias: Option<B>,
}

/// A Kimi K3 model running whole passes of one sequence on a device: activations, the Block
/// Attention Residual anchors, MLA caches and KDA states stay there; tokens go in, the last
/// row's logits come out (`model::layers::device`). Out of core, routed experts come from the
/// expert store (host cache, then disk) through the device's expert tier.
pub struct DeviceSession<'m, D: DeviceOps> {
    model: &'m KimiK3,
    dev: &'m D,
    layers: Vec<DeviceLayer<D::Buf>>,
    output_res: D::Buf,
    norm: D::Buf,
    len: usize,
}

impl<D: DeviceOps> std::fmt::Debug for DeviceSession<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSession({} layers, {} positions)",
            self.layers.len(),
            self.len
        )
    }
}

impl KimiK3 {
    /// A device session of up to `capacity` positions (its caches are allocated now).
    pub fn device_session<'m, D: DeviceOps>(
        &'m self,
        dev: &'m D,
        capacity: usize,
    ) -> Result<DeviceSession<'m, D>> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            layers.push(DeviceLayer {
                input_norm: dev.upload_f32(&layer.input_norm)?,
                post_norm: dev.upload_f32(&layer.post_norm)?,
                attn_res: dev.upload_f32(&layer.attn_res.query)?,
                mlp_res: dev.upload_f32(&layer.mlp_res.query)?,
                attn: DeviceAttn::new(dev, &layer.attn, capacity)?,
                bias: layer.ffn.device_bias(dev)?,
            });
        }
        Ok(DeviceSession {
            model: self,
            dev,
            layers,
            output_res: dev.upload_f32(&self.output_res.query)?,
            norm: dev.upload_f32(&self.norm)?,
            len: 0,
        })
    }
}

impl<D: DeviceOps> DeviceSession<'_, D> {
    /// Positions run so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has run yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Run `tokens` (the sequence's next positions) through every layer on the device, as
    /// `KimiK3::run_layers` does (anchors every `attn_res_block_size` layers, each sub-layer's
    /// input mixed over them); the last row's logits.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (m, dev, n) = (self.model, self.dev, tokens.len());
        let t = &m.cfg.text;
        let (h, eps, block) = (t.hidden_size, t.rms_norm_eps, m.cfg.attn_res_block_size);
        let stack = dev.zeros_f32((self.layers.len().div_ceil(block) + 1) * n * h)?;
        let mut anchors = 0;
        let mut run = dev.upload_f32(&super::embed_tokens(&m.embed, tokens)?)?;
        let mix = |site: (&D::Buf, f32), anchors: usize, last: &D::Buf| -> Result<D::Buf> {
            device::stack_rows(dev, last, &stack, anchors, (n, h))?;
            device::attn_res(dev, site, &stack, anchors + 1, (n, h))
        };
        let pass = ExpertPass::open(m.experts.as_deref());
        for (l, k) in self.layers.iter_mut().enumerate() {
            let layer = m.layers.get(l)?;
            let u = if anchors == 0 {
                None
            } else {
                Some(mix((&k.attn_res, layer.attn_res.eps), anchors, &run)?)
            };
            let xn = device::rms_norm(dev, u.as_ref().unwrap_or(&run), &k.input_norm, n, h, eps)?;
            let a = k.attn.run(dev, &layer.attn, &xn, n)?;
            let p = if l % block == 0 {
                device::stack_rows(dev, &run, &stack, anchors, (n, h))?;
                anchors += 1;
                a
            } else {
                device::add(dev, &run, &a, n * h)?
            };
            let mixed = mix((&k.mlp_res, layer.mlp_res.eps), anchors, &p)?;
            if pass.is_out_of_core() {
                pass.hint_next(l, &dev.download_f32(&mixed)?, n);
            }
            let xn = device::rms_norm(dev, &mixed, &k.post_norm, n, h, eps)?;
            let experts = pass.layer(l);
            let provider = experts.as_ref().map(|e| e as &dyn ExpertProvider);
            let f = layer.ffn.run_on(dev, provider, k.bias.as_ref(), &xn, n)?;
            run = device::add(dev, &p, &f, n * h)?;
        }
        pass.finish()?;
        self.len += n;
        let z = mix((&self.output_res, m.output_res.eps), anchors, &run)?;
        device::last_row_logits(dev, &z, (n, h), (&self.norm, eps), &m.lm_head)
    }
}
