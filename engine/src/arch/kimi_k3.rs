//! Kimi K3: KDA (lower-bounded gate, per-channel `A_log`, full-rank output gate) and gated
//! NoPE-MLA layers, Block Attention Residuals, SiTU, a latent MoE with MXFP4 experts combined in
//! router order plus fused shared experts, untied head. Reference: `reference/kimi-k3.md` §1
//! (the independent float64 NumPy oracle of the golden test is written from the same text).
//!
//! A plan over the shared decoder ([`super::decoder`]) in its Block Attention Residuals form
//! (`decoder_attn_res.rs`): the Kimi layer choices of [`super::kimi_linear`] with K3's
//! variant, in memory, out of core and on a device alike.

use super::decoder::{Decoder, DecoderFamily, DecoderPlan, Residual};
use super::kimi_linear::{Variant, plan_with};
use super::layers::kda::L2Norm;
use super::layers::mlp::Activation;
use super::layers::moe::Combine;
use crate::config::KimiK3Config;
use crate::error::Result;
use crate::model::Loader;

/// `F.normalize`'s floor on the L2 norm of q and k.
const L2_FLOOR: f32 = 1e-12;

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

/// The decoder plan of a K3 config.
fn plan(cfg: &KimiK3Config) -> DecoderPlan {
    let residual = Residual::AttnRes {
        block: cfg.attn_res_block_size,
    };
    plan_with(&cfg.text, &variant(cfg), "kimi_k3", residual)
}

impl DecoderFamily for KimiK3Config {
    fn plan(&self) -> DecoderPlan {
        plan(self)
    }
}

/// The in-memory model of `cfg` (the device tests open sessions on it).
pub fn load(cfg: &KimiK3Config, ld: &Loader<'_>) -> Result<Decoder> {
    Decoder::load(plan(cfg), ld)
}
