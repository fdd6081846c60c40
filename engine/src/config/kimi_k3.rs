//! Kimi K3 config: outer `model_type: kimi_k3` with a `text_config` of type `kimi_linear` plus
//! the K3 fields (SiTU betas, Block Attention Residuals, latent MoE, gated MLA, the lower-bounded
//! KDA gate and full-rank KDA output gate). See `reference/kimi-k3.md` §1.1.
//!
//! Fail-closed: every field of the root and of `text_config` must be one this implementation
//! understands (or pure metadata); root copies of `bos/eos/pad_token_id` and
//! `tie_word_embeddings` must equal the text copies.

use super::Fields;
use super::kimi_linear::{
    ATTN_RES_VARIANTS, BENIGN_FIELDS, Dialect, K3_TEXT_FIELDS, KimiLinearConfig, LINEAR_ONLY_FIELDS,
    refuse_semantic,
};
use crate::error::Result;

/// Validated Kimi K3 hyperparameters.
#[derive(Debug, Clone)]
pub struct KimiK3Config {
    /// The `kimi_linear` part (layer schedule, MLA, KDA incl. the K3 gate, router, experts).
    pub text: KimiLinearConfig,
    /// SiTU gate soft-cap `activation_situ_beta`.
    pub situ_beta: f32,
    /// SiTU up-branch soft-cap `activation_situ_linear_beta` (`None`: the up branch is linear).
    pub situ_linear_beta: Option<f32>,
    /// Block Attention Residuals block length, in layers.
    pub attn_res_block_size: usize,
    /// Latent width the routed experts run at (`routed_expert_hidden_size`).
    pub routed_expert_hidden_size: usize,
    /// RMSNorm on the latent expert sum before the up-projection.
    pub latent_moe_use_norm: bool,
    /// Sigmoid output gate `g_proj` on the MLA output.
    pub mla_use_output_gate: bool,
}

/// Root fields of a K3 config. `vision_config`/`media_placeholder_token_id` describe the
/// vision tower, which text-only inference never runs.
const K3_ROOT_FIELDS: &[&str] = &[
    "model_type",
    "text_config",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "quantization_config",
    "vision_config",
    "media_placeholder_token_id",
    "ignore_index",
];

impl KimiK3Config {
    pub(crate) fn parse(root: Fields<'_>, text: Fields<'_>) -> Result<Self> {
        refuse_semantic(root, &[LINEAR_ONLY_FIELDS, ATTN_RES_VARIANTS])?;
        root.note_unknown(&[K3_ROOT_FIELDS, BENIGN_FIELDS]);
        let base = KimiLinearConfig::parse(text, Dialect::K3, K3_TEXT_FIELDS)?;
        let beta = |field: &str| -> Result<Option<f32>> {
            match text.opt_f64(field)? {
                Some(b) if b.is_finite() && b > 0.0 => Ok(Some(b as f32)),
                Some(b) => Err(text.err(field, format!("must be a finite positive number, found {b}"))),
                None => Ok(None),
            }
        };
        let required_bool = |field: &str| {
            text.opt_bool(field)?
                .ok_or_else(|| text.err(field, "missing (a K3 architecture field)"))
        };
        let c = KimiK3Config {
            situ_beta: beta("activation_situ_beta")?
                .ok_or_else(|| text.err("activation_situ_beta", "missing"))?,
            situ_linear_beta: beta("activation_situ_linear_beta")?,
            attn_res_block_size: text.usize("attn_res_block_size")?,
            routed_expert_hidden_size: text.usize("routed_expert_hidden_size")?,
            latent_moe_use_norm: required_bool("latent_moe_use_norm")?,
            mla_use_output_gate: required_bool("mla_use_output_gate")?,
            text: base,
        };
        if c.attn_res_block_size == 0 {
            return Err(text.err("attn_res_block_size", "must be positive"));
        }
        if c.routed_expert_hidden_size == 0 {
            return Err(text.err("routed_expert_hidden_size", "must be positive"));
        }
        check_root_copies(root, &c.text)?;
        Ok(c)
    }

    /// Number of Block-AttnRes anchors before the tail (`ceil(layers / block)`).
    pub fn num_blocks(&self) -> usize {
        self.text.num_hidden_layers.div_ceil(self.attn_res_block_size)
    }
}

/// The root repeats some text fields; a disagreement is an inconsistent config.
fn check_root_copies(root: Fields<'_>, text: &KimiLinearConfig) -> Result<()> {
    let ids = [
        ("bos_token_id", text.bos_token_id.into_iter().collect::<Vec<_>>()),
        ("eos_token_id", text.eos_token_ids.clone()),
        ("pad_token_id", text.pad_token_id.into_iter().collect()),
    ];
    for (field, want) in ids {
        if root.get(field).is_some() {
            let got = root.opt_token_ids(field)?;
            if got != want {
                return Err(root.err(
                    field,
                    format!("{got:?} disagrees with text_config.{field} = {want:?}"),
                ));
            }
        }
    }
    if let Some(tie) = root.opt_bool("tie_word_embeddings")?
        && tie != text.tie_word_embeddings
    {
        return Err(root.err(
            "tie_word_embeddings",
            "disagrees with text_config.tie_word_embeddings",
        ));
    }
    Ok(())
}

impl super::TextConfig for KimiK3Config {
    const MODEL_TYPES: &'static [&'static str] = &["kimi_linear"];
    const NESTING: super::Nesting = super::Nesting::NestedIn(&["kimi_k3"]);

    fn parse(i: super::FamilyInput<'_>) -> Result<Self> {
        Self::parse(i.top, i.text)
    }
}
