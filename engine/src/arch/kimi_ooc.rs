//! Out-of-core loading shared by Kimi-Linear and Kimi K3, on the same machinery as
//! DeepSeek-V3 ([`crate::cache::assemble`]):
//!
//! * always resident (one buffer): what the architecture names (embeddings, head, final norm;
//!   K3 adds the output AttnRes site) plus, for every MoE layer, its `post_attention_layernorm`
//!   and router (`block_sparse_moe.gate` + `e_score_correction_bias`) for the look-ahead;
//! * the spine of each layer (norms, AttnRes sites, KDA/MLA attention, dense FFN or shared
//!   experts, K3's latent down/up projections and `routed_expert_norm`): a resident prefix, the
//!   rest streamed every pass through the double-buffered arena;
//! * routed experts (`block_sparse_moe.experts.{e}.w1/w2/w3`, BF16 for Kimi-Linear, MXFP4
//!   `weight_packed` + E8M0 `weight_scale` for K3): one read layout per expert, recorded from
//!   the very builder the in-memory load uses ([`load_expert`]), served by the expert cache.
//!
//! Every layer and expert is built by the architecture's own loading functions over buffers
//! holding the checkpoint's bytes, so the model computes exactly what the in-memory load does.

use std::sync::Arc;

use super::Loader;
use super::ModelSpec;
use super::kimi_linear::{Variant, load_expert, load_router};
use crate::cache::layers::LayerBuilder;
use crate::cache::spans::SpanLayout;
use crate::cache::store::{ExpertBuilder, LookaheadLayer};
use crate::cache::{LayerStore, OocOptions, OocParts, OocRuntime, load_resident, source};
use crate::config::KimiLinearConfig;
use crate::error::Result;
use crate::weights::WeightIndex;

/// A budgeted load's pieces: the architecture's fixed tensors `F`, the spine store and the
/// out-of-core runtime (whose expert store serves the MoE layers).
pub(crate) struct Budgeted<L, F> {
    pub fixed: F,
    pub layers: Arc<LayerStore<L>>,
    pub runtime: OocRuntime,
}

/// Load a Kimi checkpoint under `options.budget`. `fixed` builds the architecture's
/// always-resident tensors; `layer` builds decoder layer `i` (without routed experts when the
/// loader says so), exactly as the in-memory load does.
pub(crate) fn load<L: Send + Sync + 'static, F>(
    cfg: &KimiLinearConfig,
    v: &Variant,
    spec: &ModelSpec,
    index: Arc<WeightIndex>,
    options: &OocOptions,
    fixed: impl Fn(&Loader<'_>) -> Result<F>,
    layer: LayerBuilder<L>,
) -> Result<Budgeted<L, F>> {
    let reader = crate::cache::open_reader(&index, options)?;
    let ((fixed, lookahead), fixed_layout) = load_resident(&index, spec, &reader, |ld| {
        Ok((fixed(ld)?, lookahead_layers(cfg, ld, v)?))
    })?;
    let layer_layouts = (0..cfg.num_hidden_layers)
        .map(|i| source::record(&index, spec, false, |ld| layer(ld, i)))
        .collect::<Result<Vec<_>>>()?;
    let (ecfg, ev) = (cfg.clone(), v.clone());
    let expert_builder: ExpertBuilder = Arc::new(move |ld, l, e| load_expert(&ecfg, ld, l, e, &ev));
    let expert_layouts = expert_layouts(cfg, &index, spec, &expert_builder)?;
    let parts = OocParts {
        layer_builder: layer,
        layer_layouts,
        expert_builder,
        expert_layouts,
        lookahead,
        fixed: fixed_layout,
    };
    let (layers, runtime) = crate::cache::assemble(index, spec, reader, parts, options)?;
    Ok(Budgeted {
        fixed,
        layers,
        runtime,
    })
}

/// The read layout of every routed expert, `[layer][expert]` (empty for dense layers).
fn expert_layouts(
    cfg: &KimiLinearConfig,
    index: &WeightIndex,
    spec: &ModelSpec,
    build: &ExpertBuilder,
) -> Result<Vec<Vec<SpanLayout>>> {
    (0..cfg.num_hidden_layers)
        .map(|l| match cfg.moe_layers[l] {
            false => Ok(Vec::new()),
            true => (0..cfg.num_experts)
                .map(|e| source::record(index, spec, true, |ld| build(ld, l, e)))
                .collect::<Result<Vec<_>>>(),
        })
        .collect()
}

/// What the look-ahead needs of every MoE layer: the norm in front of its FFN and its router,
/// applied by the expert store exactly as the layer's MoE applies them (`routes` on the
/// RMS-normalised hidden row, never on K3's latent projection).
fn lookahead_layers(
    cfg: &KimiLinearConfig,
    ld: &Loader<'_>,
    v: &Variant,
) -> Result<Vec<Option<LookaheadLayer>>> {
    (0..cfg.num_hidden_layers)
        .map(|l| {
            if !cfg.moe_layers[l] {
                return Ok(None);
            }
            Ok(Some(LookaheadLayer {
                norm: ld.vector(
                    &format!("model.layers.{l}.post_attention_layernorm.weight"),
                    cfg.hidden_size,
                )?,
                eps: cfg.rms_norm_eps,
                router: load_router(cfg, ld, l, v)?,
            }))
        })
        .collect()
}
