//! DeepSeek-V3 / Kimi-K2: MLA attention, dense first layers, sigmoid-routed MoE with shared
//! experts, untied head. Reference: HF transformers `models/deepseek_v3/modeling_deepseek_v3.py`.
//!
//! Layer `i`: `x += MLA(RMSNorm_in(x)); x += FFN(RMSNorm_post(x))`, FFN dense for
//! `i < first_k_dense_replace`, MoE after. Logits: `lm_head(RMSNorm(x))`.
//!
//! Layers live in a [`LayerStore`]: all in memory ([`DeepseekV3::load`]), or, under a memory
//! budget ([`DeepseekV3::load_budgeted`]), a resident prefix plus streamed layers, with routed
//! experts served by the out-of-core [`ExpertStore`]. Both build layers with the same code.

use std::sync::Arc;

use super::ModelSpec;
use super::layers::device::{self, DeviceMla, DeviceMlaCache};
use super::layers::mla::{Mla, MlaDims, MlaRows};
use super::layers::mlp::{Activation, Mlp};
use super::layers::moe::{Combine, ExpertProvider, Moe, RouterConfig, Scoring};
use super::layers::rope::Rope;
use super::{Loader, Model, ModelInfo, RowPlan, SeqInput, StateSize, Trace, mla_caches};
use crate::backend::WeightClass;
use crate::backend::device::DeviceOps;
use crate::cache::ExpertPass;
use crate::cache::store::{ExpertBuilder, LookaheadLayer};
use crate::cache::{ExpertStore, LayerStore, OocOptions, OocParts, OocRuntime, load_resident, source};
use crate::config::DeepseekV3Config;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::ops::rms_norm;
use crate::state::{LayerState, MlaCache, SeqState};

// One per layer, built once at load: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Debug)]
struct Layer {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn: Mla,
    ffn: Ffn,
}

/// Sequence-state bytes: every layer caches the normalised latent and the shared key part.
pub(crate) fn state_size(cfg: &DeepseekV3Config) -> StateSize {
    StateSize {
        per_token: (cfg.num_hidden_layers * 4 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)) as u64,
        per_sequence: 0,
    }
}

/// A loaded DeepSeek-V3-architecture model.
#[derive(Debug)]
pub struct DeepseekV3 {
    cfg: DeepseekV3Config,
    info: ModelInfo,
    embed: Matrix,
    layers: Arc<LayerStore<Layer>>,
    norm: Vec<f32>,
    lm_head: Matrix,
    /// Routed experts when they are not inside the layers (out-of-core mode).
    experts: Option<Arc<ExpertStore>>,
}

/// The always-resident tensors: embeddings, head, final norm, and each MoE layer's FFN norm
/// and router for the look-ahead predictor.
struct Fixed {
    embed: Matrix,
    lm_head: Matrix,
    norm: Vec<f32>,
    lookahead: Vec<Option<LookaheadLayer>>,
}

fn mlp(ld: &Loader<'_>, prefix: &str, hidden: usize, width: usize) -> Result<Mlp> {
    Ok(Mlp::split(
        ld.linear(&format!("{prefix}.gate_proj"), width, hidden)?,
        ld.linear(&format!("{prefix}.up_proj"), width, hidden)?,
        ld.linear(&format!("{prefix}.down_proj"), hidden, width)?,
        Activation::Silu,
    ))
}

impl super::Architecture for DeepseekV3Config {
    fn state_size(&self) -> StateSize {
        state_size(self)
    }

    fn load(&self, ld: &Loader<'_>) -> Result<Box<dyn Model>> {
        Ok(Box::new(DeepseekV3::load(self.clone(), ld)?))
    }

    fn supports_budget(&self) -> bool {
        true
    }

    fn load_budgeted(
        &self,
        spec: &ModelSpec,
        index: Arc<crate::weights::WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Box<dyn Model>, OocRuntime)> {
        let (model, runtime) = DeepseekV3::load_budgeted(self.clone(), spec, index, options)?;
        Ok((Box::new(model), runtime))
    }
}

impl DeepseekV3 {
    /// Load and shape-check every tensor.
    pub fn load(cfg: DeepseekV3Config, ld: &Loader<'_>) -> Result<Self> {
        let h = cfg.hidden_size;
        let embed = ld.dense("model.embed_tokens.weight", cfg.vocab_size, h)?;
        let lm_head = Self::load_head(&cfg, ld, &embed)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| Self::load_layer(&cfg, ld, i))
            .collect::<Result<Vec<_>>>()?;
        let norm = ld.vector("model.norm.weight", h)?;
        let layers = Arc::new(LayerStore::resident(layers));
        Ok(Self::assemble(cfg, ld, embed, layers, norm, lm_head, None))
    }

    fn load_head(cfg: &DeepseekV3Config, ld: &Loader<'_>, embed: &Matrix) -> Result<Matrix> {
        if cfg.tie_word_embeddings && !ld.has("lm_head.weight") {
            Ok(embed.clone())
        } else {
            ld.dense("lm_head.weight", cfg.vocab_size, cfg.hidden_size)
        }
    }

    fn assemble(
        cfg: DeepseekV3Config,
        ld: &Loader<'_>,
        embed: Matrix,
        layers: Arc<LayerStore<Layer>>,
        norm: Vec<f32>,
        lm_head: Matrix,
        experts: Option<Arc<ExpertStore>>,
    ) -> Self {
        let h = cfg.hidden_size;
        let info = ModelInfo {
            arch: "deepseek_v3",
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
        DeepseekV3 {
            norm,
            embed,
            layers,
            lm_head,
            info,
            cfg,
            experts,
        }
    }

    /// Load under `options.budget`: the fixed tensors and a prefix of layers resident, the
    /// other layers streamed each pass, routed experts through the expert cache.
    pub fn load_budgeted(
        cfg: DeepseekV3Config,
        spec: &ModelSpec,
        index: Arc<crate::weights::WeightIndex>,
        options: &OocOptions,
    ) -> Result<(Self, OocRuntime)> {
        let reader = crate::cache::open_reader(&index, options)?;
        let (fixed, fixed_layout) = load_resident(&index, spec, &reader, |ld| Self::load_fixed(&cfg, ld))?;
        let layer_layouts = (0..cfg.num_hidden_layers)
            .map(|i| source::record(&index, spec, false, |ld| Self::load_layer(&cfg, ld, i)))
            .collect::<Result<Vec<_>>>()?;
        let (h, width) = (cfg.hidden_size, cfg.moe_intermediate_size);
        let expert_builder: ExpertBuilder =
            Arc::new(move |ld, l, e| mlp(ld, &format!("model.layers.{l}.mlp.experts.{e}"), h, width));
        let expert_layouts = (0..cfg.num_hidden_layers)
            .map(|l| match cfg.is_moe_layer(l) {
                false => Ok(Vec::new()),
                true => (0..cfg.n_routed_experts)
                    .map(|e| source::record(&index, spec, true, |ld| expert_builder(ld, l, e)))
                    .collect::<Result<Vec<_>>>(),
            })
            .collect::<Result<Vec<_>>>()?;
        let layer_cfg = cfg.clone();
        let parts = OocParts {
            layer_builder: Arc::new(move |ld, i| Self::load_layer(&layer_cfg, ld, i)),
            layer_layouts,
            expert_builder,
            expert_layouts,
            lookahead: fixed.lookahead,
            fixed: fixed_layout,
        };
        let (layers, runtime) = crate::cache::assemble(index.clone(), spec, reader, parts, options)?;
        let ld = Loader::new(&index, spec);
        let model = Self::assemble(
            cfg,
            &ld,
            fixed.embed,
            layers,
            fixed.norm,
            fixed.lm_head,
            Some(runtime.experts.clone()),
        );
        Ok((model, runtime))
    }

    fn load_fixed(cfg: &DeepseekV3Config, ld: &Loader<'_>) -> Result<Fixed> {
        let h = cfg.hidden_size;
        let embed = ld.dense("model.embed_tokens.weight", cfg.vocab_size, h)?;
        let lm_head = Self::load_head(cfg, ld, &embed)?;
        let lookahead = (0..cfg.num_hidden_layers)
            .map(|i| {
                if !cfg.is_moe_layer(i) {
                    return Ok(None);
                }
                let p = format!("model.layers.{i}");
                Ok(Some(LookaheadLayer {
                    norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                    eps: cfg.rms_norm_eps,
                    router: Self::router(cfg, ld, &p, Vec::new(), None)?,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Fixed {
            embed,
            lm_head,
            norm: ld.vector("model.norm.weight", h)?,
            lookahead,
        })
    }

    fn router(
        cfg: &DeepseekV3Config,
        ld: &Loader<'_>,
        p: &str,
        experts: Vec<Mlp>,
        shared: Option<Mlp>,
    ) -> Result<Moe> {
        let e = cfg.n_routed_experts;
        Ok(Moe {
            gate: ld.dense(&format!("{p}.mlp.gate.weight"), e, cfg.hidden_size)?,
            bias: ld.vector(&format!("{p}.mlp.gate.e_score_correction_bias"), e)?,
            logit_bias: Vec::new(),
            router: RouterConfig {
                scoring: Scoring::Sigmoid,
                top_k: cfg.num_experts_per_tok,
                n_group: cfg.n_group,
                topk_group: cfg.topk_group,
                norm_topk_prob: cfg.norm_topk_prob,
                scaling: cfg.routed_scaling_factor,
            },
            experts,
            shared,
            shared_gate: None,
            latent: None,
            combine: Combine::Ascending,
        })
    }

    fn load_layer(cfg: &DeepseekV3Config, ld: &Loader<'_>, i: usize) -> Result<Layer> {
        let h = cfg.hidden_size;
        let p = format!("model.layers.{i}");
        let qk = cfg.qk_head_dim();
        let dims = MlaDims {
            heads: cfg.num_attention_heads,
            nope: cfg.qk_nope_head_dim,
            rope: cfg.qk_rope_head_dim,
            v: cfg.v_head_dim,
            kv_lora: cfg.kv_lora_rank,
            eps: cfg.rms_norm_eps,
            scale: ((qk as f64).powf(-0.5) * cfg.rope.softmax_scale_multiplier()) as f32,
        };
        let rotary = Some(Rope::new(&cfg.rope, cfg.qk_rope_head_dim, cfg.rope_interleave));
        let attn = Mla::load(
            ld,
            &format!("{p}.self_attn"),
            h,
            cfg.q_lora_rank,
            dims,
            rotary,
            None,
        )?;
        let ffn = if cfg.is_moe_layer(i) {
            let e = if ld.routed_experts() {
                cfg.n_routed_experts
            } else {
                0
            };
            let experts = (0..e)
                .map(|x| mlp(ld, &format!("{p}.mlp.experts.{x}"), h, cfg.moe_intermediate_size))
                .collect::<Result<Vec<_>>>()?;
            let shared = match cfg.n_shared_experts {
                0 => None,
                s => Some(mlp(
                    ld,
                    &format!("{p}.mlp.shared_experts"),
                    h,
                    cfg.moe_intermediate_size * s,
                )?),
            };
            Ffn::Moe(Self::router(cfg, ld, &p, experts, shared)?)
        } else {
            Ffn::Dense(mlp(ld, &format!("{p}.mlp"), h, cfg.intermediate_size)?)
        };
        Ok(Layer {
            input_norm: ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
            post_norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
            attn,
            ffn,
        })
    }

    fn norm_rows(&self, x: &[f32], weight: &[f32]) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let mut out = vec![0.0; x.len()];
        for (src, dst) in x.chunks(h).zip(out.chunks_mut(h)) {
            rms_norm(src, weight, self.cfg.rms_norm_eps, dst);
        }
        out
    }
}

/// Every layer of a DeepSeek-V3 state is an MLA cache.
fn check_state(state: &SeqState, layers: usize) -> Result<()> {
    let ok = state.layers.len() == layers && state.layers.iter().all(|l| matches!(l, LayerState::Mla(_)));
    if ok { Ok(()) } else { Err(super::foreign_state()) }
}

impl Model for DeepseekV3 {
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
        SeqState::new(
            (0..self.layers.len())
                .map(|_| LayerState::Mla(MlaCache::default()))
                .collect(),
        )
    }

    fn forward(&self, batch: &mut [SeqInput<'_>], trace: Option<&mut Trace>) -> Result<Vec<f32>> {
        let ends = super::DecoderEnds {
            embed: &self.embed,
            norm: &self.norm,
            lm_head: &self.lm_head,
            eps: self.cfg.rms_norm_eps,
            info: &self.info,
        };
        let layers = self.layers.len();
        super::decoder_pass(
            ends,
            batch,
            trace,
            |s| check_state(s, layers),
            |batch, plan, x, trace| self.run_layers(batch, plan, x, trace),
        )
    }
}

impl DeepseekV3 {
    /// Every decoder layer over the rows of `x`; on error the caller rolls the caches back.
    fn run_layers(
        &self,
        batch: &mut [SeqInput<'_>],
        plan: &RowPlan,
        x: &mut [f32],
        mut trace: Option<&mut Trace>,
    ) -> Result<()> {
        let n = plan.len();
        let pass = ExpertPass::open(self.experts.as_deref());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let xn = self.norm_rows(x, &layer.input_norm);
            let mut caches: Vec<&mut MlaCache> = mla_caches(batch, l);
            let mut rows = MlaRows {
                caches: &mut caches,
                seq: &plan.seq,
                pos: &plan.pos,
            };
            let a = layer.attn.forward(&xn, n, &mut rows);
            x.iter_mut().zip(&a).for_each(|(x, a)| *x += a);
            let xn = self.norm_rows(x, &layer.post_norm);
            pass.hint_next(l, x, n);
            let f = match (&layer.ffn, pass.layer(l)) {
                (Ffn::Dense(m), _) => m.forward(&xn, n),
                (Ffn::Moe(m), None) => m.forward(&xn, n),
                (Ffn::Moe(m), Some(experts)) => m.forward_with(&xn, n, &experts)?,
            };
            x.iter_mut().zip(&f).for_each(|(x, f)| *x += f);
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("layers.{l}"), x);
            }
        }
        pass.finish()
    }
}

/// One decoder layer's device-resident constants.
struct DeviceLayer<B> {
    input_norm: B,
    post_norm: B,
    attn: DeviceMla<B>,
    bias: Option<B>,
}

/// A DeepSeek-V3 model running whole passes of one sequence on a device: activations and the
/// latent caches stay there; tokens go in, the last row's logits come out
/// (`model::layers::device`). Out of core, routed experts come from the expert store (host
/// cache, then disk) and are uploaded through the device's expert tier.
pub struct DeviceSession<'m, D: DeviceOps> {
    model: &'m DeepseekV3,
    dev: &'m D,
    layers: Vec<DeviceLayer<D::Buf>>,
    caches: Vec<DeviceMlaCache<D::Buf>>,
    norm: D::Buf,
}

impl DeepseekV3 {
    /// A device session of up to `capacity` positions (its caches are allocated now).
    pub fn device_session<'m, D: DeviceOps>(
        &'m self,
        dev: &'m D,
        capacity: usize,
    ) -> Result<DeviceSession<'m, D>> {
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut caches = Vec::with_capacity(self.layers.len());
        for l in 0..self.layers.len() {
            let layer = self.layers.get(l)?;
            let bias = match &layer.ffn {
                Ffn::Moe(m) if !m.bias.is_empty() => Some(dev.upload_f32(&m.bias)?),
                _ => None,
            };
            layers.push(DeviceLayer {
                input_norm: dev.upload_f32(&layer.input_norm)?,
                post_norm: dev.upload_f32(&layer.post_norm)?,
                attn: DeviceMla::new(dev, &layer.attn)?,
                bias,
            });
            let d = &layer.attn.dims;
            caches.push(DeviceMlaCache {
                latent: dev.zeros_f32(capacity * d.kv_lora)?,
                rope: dev.zeros_f32(capacity * d.rope)?,
                len: 0,
                capacity,
            });
        }
        Ok(DeviceSession {
            model: self,
            dev,
            layers,
            caches,
            norm: dev.upload_f32(&self.norm)?,
        })
    }
}

impl<D: DeviceOps> std::fmt::Debug for DeviceSession<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceSession({} layers, {} positions)",
            self.layers.len(),
            self.len()
        )
    }
}

impl<D: DeviceOps> DeviceSession<'_, D> {
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.caches.first().map_or(0, |c| c.len)
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Run `tokens` (the sequence's next positions) through every layer on the device; the last
    /// row's logits.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (m, dev, n) = (self.model, self.dev, tokens.len());
        let (h, eps) = (m.cfg.hidden_size, m.cfg.rms_norm_eps);
        let mut x = dev.upload_f32(&super::embed_tokens(&m.embed, tokens)?)?;
        let pass = ExpertPass::open(m.experts.as_deref());
        for (l, (k, cache)) in self.layers.iter().zip(&mut self.caches).enumerate() {
            let layer = m.layers.get(l)?;
            let xn = device::rms_norm(dev, &x, &k.input_norm, n, h, eps)?;
            let a = device::mla(dev, (&layer.attn, &k.attn), &xn, n, cache)?;
            x = device::add(dev, &x, &a, n * h)?;
            let xn = device::rms_norm(dev, &x, &k.post_norm, n, h, eps)?;
            if pass.is_out_of_core() {
                pass.hint_next(l, &dev.download_f32(&x)?, n);
            }
            let experts = pass.layer(l);
            let provider = experts.as_ref().map(|e| e as &dyn ExpertProvider);
            let f = match &layer.ffn {
                Ffn::Dense(mlp) => device::mlp(dev, mlp, WeightClass::Spine, &xn, n)?,
                Ffn::Moe(moe) => device::moe(dev, (moe, provider), k.bias.as_ref(), &xn, n)?,
            };
            x = device::add(dev, &x, &f, n * h)?;
        }
        pass.finish()?;
        device::last_row_logits(dev, &x, (n, h), (&self.norm, eps), &m.lm_head)
    }
}
