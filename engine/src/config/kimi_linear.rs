//! Kimi-Linear config (`model_type: kimi_linear`; Moonshot's `configuration_kimi.py` and HF
//! `KimiLinearConfig`), which is also the `text_config` of Kimi K3.
//!
//! Both spellings of the renamed fields are accepted (Kimi name / HF attribute name:
//! `num_experts`/`num_local_experts`, `moe_renormalize`/`norm_topk_prob`,
//! `num_expert_group`/`n_group`, `num_experts_per_token`/`num_experts_per_tok`,
//! `num_shared_experts`/`n_shared_experts`, `model_max_length`/`max_position_embeddings`); when
//! both are written they must agree. The layer schedule comes from `linear_attn_config`'s
//! **one-based** `kda_layers` / `full_attn_layers`, which must partition `1..=num_hidden_layers`.
//! Fields derived by HF (`layer_types`, `mlp_layer_types`, `linear_*`, `qk_head_dim`, `head_dim`)
//! are checked against the source fields. Any other field not listed here is an error: the config
//! is fail-closed, so a new architecture knob can never be silently ignored.

use serde_json::Value;

use super::Fields;
use crate::error::Result;

/// Which of the two dialects is being parsed (they allow different field sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// A flat `kimi_linear` config.
    Linear,
    /// The `text_config` of a `kimi_k3` config.
    K3,
}

/// Attention type of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Kimi Delta Attention (linear attention with a recurrent state).
    Kda,
    /// Multi-head latent attention (softmax attention over a latent cache).
    Mla,
}

/// How the KDA log-decay is formed from `f = f_b(f_a(x)) + dt_bias`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KdaDecay {
    /// Kimi-Linear: `g = -exp(A_log) * softplus(f)`.
    Softplus,
    /// K3 (`gate_lower_bound`): `g = lower_bound * sigmoid(exp(A_log) * f)`.
    LowerBound(f32),
}

/// `linear_attn_config`: the KDA layers' shape.
#[derive(Debug, Clone, PartialEq)]
pub struct KdaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    pub short_conv_kernel_size: usize,
    /// Full-rank output gate `g_proj` (K3) instead of the low-rank `g_b_proj(g_a_proj(x))`.
    pub use_full_rank_gate: bool,
    pub decay: KdaDecay,
}

/// Validated Kimi-Linear hyperparameters.
#[derive(Debug, Clone)]
pub struct KimiLinearConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense MLP layers.
    pub intermediate_size: usize,
    /// Width of one routed expert.
    pub moe_intermediate_size: usize,
    pub num_hidden_layers: usize,
    /// MLA heads.
    pub num_attention_heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_token: usize,
    pub num_shared_experts: usize,
    pub num_expert_group: usize,
    pub topk_group: usize,
    pub moe_renormalize: bool,
    pub routed_scaling_factor: f32,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub kda: KdaConfig,
    /// Attention type per zero-based layer.
    pub layer_kinds: Vec<AttnKind>,
    /// Whether each zero-based layer's FFN is the routed MoE (else the dense MLP).
    pub moe_layers: Vec<bool>,
}

/// Fields the Kimi-Linear parser reads (both dialects).
const COMMON_FIELDS: &[&str] = &[
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "mla_use_nope",
    "num_experts",
    "num_local_experts",
    "num_experts_per_token",
    "num_experts_per_tok",
    "num_shared_experts",
    "n_shared_experts",
    "num_expert_group",
    "n_group",
    "topk_group",
    "use_grouped_topk",
    "topk_method",
    "moe_renormalize",
    "norm_topk_prob",
    "moe_router_activation_func",
    "routed_scaling_factor",
    "first_k_dense_replace",
    "moe_layer_freq",
    "mlp_layer_types",
    "layer_types",
    "rms_norm_eps",
    "model_max_length",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "hidden_act",
    "linear_attn_config",
    "linear_head_dim",
    "linear_num_heads",
    "linear_conv_kernel_dim",
    "qk_head_dim",
    "head_dim",
    "num_nextn_predict_layers",
    "attention_bias",
    "quantization_config",
];

/// Extra fields a flat Kimi-Linear config may carry: RoPE settings, unused because its MLA is NoPE.
pub(crate) const LINEAR_ONLY_FIELDS: &[&str] = &["rope_theta", "rope_scaling", "rope_parameters"];

/// The architecture fields only K3's text config has (refused in a Kimi-Linear config).
pub(crate) const K3_TEXT_FIELDS: &[&str] = &[
    "mla_use_output_gate",
    "attn_res_block_size",
    "routed_expert_hidden_size",
    "latent_moe_use_norm",
    "activation_situ_beta",
    "activation_situ_linear_beta",
];

/// Fields that never change the computation: metadata, training-only and HF bookkeeping.
pub(crate) const BENIGN_FIELDS: &[&str] = &[
    "architectures",
    "auto_map",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "initializer_range",
    "use_cache",
    "attention_dropout",
    "output_router_logits",
    "pretraining_tp",
    "chunk_size_feed_forward",
    "id2label",
    "label2id",
    "is_encoder_decoder",
    "output_attentions",
    "output_hidden_states",
    "problem_type",
    "return_dict",
    "router_aux_loss_coef",
    "aux_loss_alpha",
    "deltafin_synthetic",
];

const KDA_FIELDS: &[&str] = &[
    "num_heads",
    "head_dim",
    "short_conv_kernel_size",
    "kda_layers",
    "full_attn_layers",
];
const KDA_K3_FIELDS: &[&str] = &["use_full_rank_gate", "gate_lower_bound"];

/// Keys that would change the computation but that this dialect does not implement: present,
/// they are refused by name (another dialect's architecture fields, RoPE on a NoPE model,
/// attention-residual variants other than Block AttnRes).
pub(crate) fn refuse_semantic(f: Fields<'_>, lists: &[&[&str]]) -> Result<()> {
    let mut keys: Vec<&String> = f.map.keys().collect();
    keys.sort();
    match keys
        .into_iter()
        .find(|k| lists.iter().any(|l| l.contains(&k.as_str())))
    {
        Some(key) => Err(f.err(
            key,
            "changes the computation in a way this implementation does not run",
        )),
        None => Ok(()),
    }
}

/// Keys changing the attention residuals in ways other than Block AttnRes (none implemented).
pub(crate) const ATTN_RES_VARIANTS: &[&str] = &["attn_res_variant"];

/// A field that may be spelled two ways; both present means they must agree.
fn aliased<T: PartialEq + std::fmt::Debug>(
    f: Fields<'_>,
    name: &str,
    alias: &str,
    read: impl Fn(&str) -> Result<Option<T>>,
) -> Result<Option<T>> {
    match (read(name)?, read(alias)?) {
        (Some(a), Some(b)) if a != b => Err(f.err(alias, format!("{b:?} disagrees with `{name}` = {a:?}"))),
        (Some(a), _) => Ok(Some(a)),
        (None, b) => Ok(b),
    }
}

impl KimiLinearConfig {
    /// A flat Kimi-Linear `config.json` (`model_type kimi_linear`).
    pub(crate) fn parse_linear(f: Fields<'_>) -> Result<Self> {
        Self::parse(f, Dialect::Linear, &[])
    }

    pub(crate) fn parse(f: Fields<'_>, dialect: Dialect, extra: &[&str]) -> Result<Self> {
        let mut known: Vec<&[&str]> = vec![COMMON_FIELDS, BENIGN_FIELDS, extra];
        match dialect {
            Dialect::Linear => {
                known.push(LINEAR_ONLY_FIELDS);
                refuse_semantic(f, &[K3_TEXT_FIELDS, ATTN_RES_VARIANTS])?;
            }
            Dialect::K3 => refuse_semantic(f, &[LINEAR_ONLY_FIELDS, ATTN_RES_VARIANTS])?,
        }
        f.note_unknown(&known);
        let usize_alias = |a: &str, b: &str| aliased(f, a, b, |n| f.opt_usize(n));
        let num_hidden_layers = f.usize("num_hidden_layers")?;
        let max_position_embeddings = usize_alias("model_max_length", "max_position_embeddings")?
            .ok_or_else(|| f.err("max_position_embeddings", "missing (or `model_max_length`)"))?;
        let c = KimiLinearConfig {
            vocab_size: f.usize("vocab_size")?,
            hidden_size: f.usize("hidden_size")?,
            intermediate_size: f.usize("intermediate_size")?,
            moe_intermediate_size: f.usize("moe_intermediate_size")?,
            num_hidden_layers,
            num_attention_heads: f.usize("num_attention_heads")?,
            q_lora_rank: f.opt_usize("q_lora_rank")?,
            kv_lora_rank: f.usize("kv_lora_rank")?,
            qk_nope_head_dim: f.usize("qk_nope_head_dim")?,
            qk_rope_head_dim: f.usize("qk_rope_head_dim")?,
            v_head_dim: f.usize("v_head_dim")?,
            num_experts: usize_alias("num_experts", "num_local_experts")?
                .ok_or_else(|| f.err("num_experts", "missing (or `num_local_experts`)"))?,
            num_experts_per_token: usize_alias("num_experts_per_token", "num_experts_per_tok")?
                .ok_or_else(|| f.err("num_experts_per_token", "missing (or `num_experts_per_tok`)"))?,
            num_shared_experts: usize_alias("num_shared_experts", "n_shared_experts")?
                .ok_or_else(|| f.err("num_shared_experts", "missing (or `n_shared_experts`)"))?,
            num_expert_group: usize_alias("num_expert_group", "n_group")?.unwrap_or(1),
            topk_group: f.opt_usize("topk_group")?.unwrap_or(1),
            moe_renormalize: aliased(f, "moe_renormalize", "norm_topk_prob", |n| f.opt_bool(n))?
                .ok_or_else(|| f.err("moe_renormalize", "missing (or `norm_topk_prob`)"))?,
            routed_scaling_factor: f.f64("routed_scaling_factor")? as f32,
            rms_norm_eps: f.f64("rms_norm_eps")? as f32,
            max_position_embeddings,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            bos_token_id: f.opt_token_ids("bos_token_id")?.first().copied(),
            eos_token_ids: f.opt_token_ids("eos_token_id")?,
            pad_token_id: f.opt_token_ids("pad_token_id")?.first().copied(),
            kda: parse_kda(f, dialect)?,
            layer_kinds: parse_layer_kinds(f, num_hidden_layers)?,
            moe_layers: parse_moe_layers(f, num_hidden_layers)?,
        };
        c.validate(f, dialect)?;
        Ok(c)
    }

    fn validate(&self, f: Fields<'_>, dialect: Dialect) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("v_head_dim", self.v_head_dim),
            ("num_expert_group", self.num_expert_group),
        ];
        f.positive(&positive)?;
        if let Some(kv) = f.opt_usize("num_key_value_heads")?
            && kv != self.num_attention_heads
        {
            let want = self.num_attention_heads;
            return Err(f.err(
                "num_key_value_heads",
                format!("MLA needs {want} (= num_attention_heads), found {kv}"),
            ));
        }
        if f.opt_bool("mla_use_nope")? == Some(false) {
            return Err(f.err(
                "mla_use_nope",
                "rotary MLA is not part of this architecture (supported: true)",
            ));
        }
        if dialect == Dialect::K3 && f.opt_bool("mla_use_nope")?.is_none() {
            return Err(f.err("mla_use_nope", "missing (K3 requires true)"));
        }
        if f.opt_bool("attention_bias")? == Some(true) {
            return Err(f.err("attention_bias", "attention biases are not supported"));
        }
        self.validate_moe(f)?;
        self.validate_derived(f)?;
        let want_act = if dialect == Dialect::K3 { "situ" } else { "silu" };
        match f.opt_str("hidden_act")? {
            Some(a) if a == want_act => {}
            Some(a) => {
                return Err(f.err(
                    "hidden_act",
                    format!("`{a}` is not supported here (supported: {want_act})"),
                ));
            }
            None => return Err(f.err("hidden_act", "missing")),
        }
        Ok(())
    }

    fn validate_moe(&self, f: Fields<'_>) -> Result<()> {
        if !self.moe_layers.iter().any(|&m| m) {
            return Ok(());
        }
        let (e, k) = (self.num_experts, self.num_experts_per_token);
        if k == 0 || k > e {
            return Err(f.err("num_experts_per_token", format!("must be in 1..={e}")));
        }
        if e % self.num_expert_group != 0 {
            return Err(f.err("num_expert_group", format!("must divide num_experts ({e})")));
        }
        if self.topk_group == 0 || self.topk_group > self.num_expert_group {
            return Err(f.err("topk_group", format!("must be in 1..={}", self.num_expert_group)));
        }
        let per_group = e / self.num_expert_group;
        if self.num_expert_group > 1 && per_group < 2 {
            return Err(f.err(
                "num_expert_group",
                "group-limited routing needs at least 2 experts per group",
            ));
        }
        if self.topk_group * per_group < k {
            return Err(f.err(
                "topk_group",
                "the kept groups hold fewer experts than num_experts_per_token",
            ));
        }
        if f.opt_bool("use_grouped_topk")? == Some(false) && self.num_expert_group != 1 {
            return Err(f.err(
                "use_grouped_topk",
                "false with num_expert_group > 1 is not supported",
            ));
        }
        let checks = [
            ("moe_router_activation_func", "sigmoid"),
            ("topk_method", "noaux_tc"),
        ];
        for (field, want) in checks {
            if let Some(v) = f.opt_str(field)?
                && v != want
            {
                return Err(f.err(field, format!("`{v}` is not supported (supported: {want})")));
            }
        }
        if !self.routed_scaling_factor.is_finite() {
            return Err(f.err("routed_scaling_factor", "must be finite"));
        }
        Ok(())
    }

    /// HF writes derived copies of some fields; they must agree with the source fields.
    fn validate_derived(&self, f: Fields<'_>) -> Result<()> {
        let derived = [
            ("linear_head_dim", self.kda.head_dim),
            ("linear_num_heads", self.kda.num_heads),
            ("linear_conv_kernel_dim", self.kda.short_conv_kernel_size),
            ("qk_head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim),
            // HF sets `head_dim = qk_rope_head_dim` (and ignores any stored value).
            ("head_dim", self.qk_rope_head_dim),
        ];
        for (field, want) in derived {
            if let Some(v) = f.opt_usize(field)?
                && v != want
            {
                return Err(f.err(
                    field,
                    format!("{v} disagrees with the value derived from the config ({want})"),
                ));
            }
        }
        if let Some(moe_freq) = f.opt_usize("moe_layer_freq")?
            && moe_freq != 1
        {
            return Err(f.err(
                "moe_layer_freq",
                format!("{moe_freq} is not supported (supported: 1)"),
            ));
        }
        Ok(())
    }

    /// `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Channels of one KDA q/k/v projection (`num_heads * head_dim`).
    pub fn kda_width(&self) -> usize {
        self.kda.num_heads * self.kda.head_dim
    }
}

fn parse_kda(f: Fields<'_>, dialect: Dialect) -> Result<KdaConfig> {
    let map = match f.get("linear_attn_config") {
        Some(Value::Object(m)) => m,
        Some(_) => return Err(f.err("linear_attn_config", "expected an object")),
        None => return Err(f.err("linear_attn_config", "missing")),
    };
    let scope = format!("{}linear_attn_config.", f.scope);
    let l = Fields {
        map,
        path: f.path,
        scope: &scope,
    };
    let extra: &[&str] = if dialect == Dialect::K3 {
        KDA_K3_FIELDS
    } else {
        refuse_semantic(l, &[KDA_K3_FIELDS])?;
        &[]
    };
    if l.opt_bool("use_short_conv")? == Some(false) {
        return Err(l.err(
            "use_short_conv",
            "false is not implemented (KDA always convolves)",
        ));
    }
    l.note_unknown(&[KDA_FIELDS, extra, &["use_short_conv"]]);
    let (use_full_rank_gate, decay) = match dialect {
        Dialect::Linear => (false, KdaDecay::Softplus),
        Dialect::K3 => {
            let full = l
                .opt_bool("use_full_rank_gate")?
                .ok_or_else(|| l.err("use_full_rank_gate", "missing"))?;
            let bound = l.f64("gate_lower_bound")?;
            if !(bound.is_finite() && bound < 0.0) {
                return Err(l.err(
                    "gate_lower_bound",
                    format!("must be a finite negative number, found {bound}"),
                ));
            }
            (full, KdaDecay::LowerBound(bound as f32))
        }
    };
    let c = KdaConfig {
        num_heads: l.usize("num_heads")?,
        head_dim: l.usize("head_dim")?,
        short_conv_kernel_size: l.usize("short_conv_kernel_size")?,
        use_full_rank_gate,
        decay,
    };
    for (field, v) in [
        ("num_heads", c.num_heads),
        ("head_dim", c.head_dim),
        ("short_conv_kernel_size", c.short_conv_kernel_size),
    ] {
        if v == 0 {
            return Err(l.err(field, "must be positive"));
        }
    }
    Ok(c)
}

/// A one-based layer list, each entry in `1..=layers`.
fn layer_list(l: Fields<'_>, field: &str, layers: usize) -> Result<Vec<usize>> {
    let list = l.get(field).ok_or_else(|| l.err(field, "missing"))?;
    let items = list
        .as_array()
        .ok_or_else(|| l.err(field, "expected a list of one-based layer numbers"))?;
    items
        .iter()
        .map(|v| match v.as_u64() {
            Some(n) if n >= 1 && n as usize <= layers => Ok(n as usize),
            _ => Err(l.err(
                field,
                format!("entry {v} is not a one-based layer number in 1..={layers}"),
            )),
        })
        .collect()
}

fn parse_layer_kinds(f: Fields<'_>, layers: usize) -> Result<Vec<AttnKind>> {
    let Some(Value::Object(map)) = f.get("linear_attn_config") else {
        return Err(f.err("linear_attn_config", "missing"));
    };
    let scope = format!("{}linear_attn_config.", f.scope);
    let l = Fields {
        map,
        path: f.path,
        scope: &scope,
    };
    let mut kinds: Vec<Option<AttnKind>> = vec![None; layers];
    for (field, kind) in [("kda_layers", AttnKind::Kda), ("full_attn_layers", AttnKind::Mla)] {
        for n in layer_list(l, field, layers)? {
            if let Some(prev) = kinds[n - 1] {
                let what = if prev == kind {
                    "twice"
                } else {
                    "in both kda_layers and full_attn_layers"
                };
                return Err(l.err(
                    field,
                    format!("layer {n} is listed {what}: the lists must partition the layers"),
                ));
            }
            kinds[n - 1] = Some(kind);
        }
    }
    if let Some(missing) = kinds.iter().position(Option::is_none) {
        let n = missing + 1;
        return Err(l.err(
            "kda_layers",
            format!("layer {n} is in neither list: the lists must partition 1..={layers}"),
        ));
    }
    let kinds: Vec<AttnKind> = kinds.into_iter().map(|k| k.expect("checked")).collect();
    if let Some(types) = f.get("layer_types") {
        let names: Vec<&str> = kinds
            .iter()
            .map(|k| {
                if *k == AttnKind::Kda {
                    "linear_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        let given: Option<Vec<&str>> = types
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect());
        if given.as_deref() != Some(&names[..]) {
            return Err(f.err(
                "layer_types",
                "disagrees with linear_attn_config's kda_layers/full_attn_layers",
            ));
        }
    }
    Ok(kinds)
}

fn parse_moe_layers(f: Fields<'_>, layers: usize) -> Result<Vec<bool>> {
    let from_types = match f.get("mlp_layer_types") {
        None => None,
        Some(v) => {
            let items = v.as_array().filter(|a| a.len() == layers);
            let kinds: Option<Vec<bool>> = items.and_then(|a| {
                a.iter()
                    .map(|t| match t.as_str() {
                        Some("sparse") => Some(true),
                        Some("dense") => Some(false),
                        _ => None,
                    })
                    .collect()
            });
            Some(kinds.ok_or_else(|| {
                f.err(
                    "mlp_layer_types",
                    format!("expected {layers} entries of \"dense\"/\"sparse\""),
                )
            })?)
        }
    };
    let from_k = match f.opt_usize("first_k_dense_replace")? {
        Some(k) if k > layers => return Err(f.err("first_k_dense_replace", "exceeds num_hidden_layers")),
        Some(k) => Some((0..layers).map(|i| i >= k).collect::<Vec<bool>>()),
        None => None,
    };
    match (from_k, from_types) {
        (Some(a), Some(b)) if a != b => Err(f.err("mlp_layer_types", "disagrees with first_k_dense_replace")),
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Err(f.err("first_k_dense_replace", "missing (or `mlp_layer_types`)")),
    }
}

impl super::TextConfig for KimiLinearConfig {
    const MODEL_TYPES: &'static [&'static str] = &["kimi_linear"];
    const NESTING: super::Nesting = super::Nesting::Flat;

    fn parse(i: super::FamilyInput<'_>) -> Result<Self> {
        Self::parse_linear(i.text)
    }
}
