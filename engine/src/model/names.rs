//! Published tensor names of families that do not use HF's: the layers ask for HF's names and
//! [`super::Loader`] translates them here (the inverse of HF `conversion_mapping.py`'s renames
//! for the family).

/// DeepSeek-V4's published name for HF's `hf` (`DeepseekV4ForCausalLM` naming): no `model.`
/// root, `embed` / `head`, `attn` / `ffn` blocks, DeepSeek's module names (`wq_a`, `wkv`,
/// `wo_a`, `attn_sink`, `ape`, per-expert `w1`/`w2`/`w3`), the indexer's compressor under
/// `attn.indexer.compressor`, and hyper-connection parameters as `hc_{attn,ffn}_{fn,base,scale}`.
pub(crate) fn deepseek_v4(hf: &str) -> String {
    let root = [
        ("model.embed_tokens.", "embed."),
        ("lm_head.", "head."),
        ("model.norm.", "norm."),
        ("model.hc_head.hc_fn", "hc_head_fn"),
        ("model.hc_head.hc_base", "hc_head_base"),
        ("model.hc_head.hc_scale", "hc_head_scale"),
    ];
    for (from, to) in root {
        if let Some(rest) = hf.strip_prefix(from) {
            return format!("{to}{rest}");
        }
    }
    let Some(layer) = hf.strip_prefix("model.") else {
        return hf.to_string();
    };
    let mut n = layer.to_string();
    for (from, to) in [
        (
            ".self_attn.compressor.indexer.scorer.weights_proj.",
            ".attn.indexer.weights_proj.",
        ),
        (".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."),
        (".self_attn.compressor.indexer.", ".attn.indexer.compressor."),
        (".self_attn.", ".attn."),
        (".mlp.", ".ffn."),
        (".input_layernorm.", ".attn_norm."),
        (".post_attention_layernorm.", ".ffn_norm."),
        (".attn_hc.", ".hc_attn_"),
        (".ffn_hc.", ".hc_ffn_"),
        (".attn.sinks", ".attn.attn_sink"),
        (".q_a_proj.", ".wq_a."),
        (".q_a_norm.", ".q_norm."),
        (".q_b_proj.", ".wq_b."),
        (".kv_proj.", ".wkv."),
        (".o_a_proj.", ".wo_a."),
        (".o_b_proj.", ".wo_b."),
        (".position_bias", ".ape"),
        (".gate.e_score_correction_bias", ".gate.bias"),
        (".compressor.kv_norm.", ".compressor.norm."),
        // An MTP block's own hyper head (`mtp.{i}.hc_head_fn`, read as a layer's).
        (".hc_head.hc_", ".hc_head_"),
    ] {
        n = n.replace(from, to);
    }
    // Expert and shared-expert projections are w1 / w3 / w2; a compressor's gate is `wgate`.
    let ffn = n.contains(".ffn.");
    for (from, expert, other) in [
        (".gate_proj.", ".w1.", ".wgate."),
        (".up_proj.", ".w3.", ".up_proj."),
        (".down_proj.", ".w2.", ".down_proj."),
    ] {
        n = n.replace(from, if ffn { expert } else { other });
    }
    n
}

#[cfg(test)]
mod tests {
    use super::deepseek_v4;

    /// Every rename HF's `conversion_mapping.py` applies for `deepseek_v4`, inverted.
    #[test]
    fn deepseek_v4_names_are_the_published_ones() {
        for (hf, published) in [
            ("model.embed_tokens.weight", "embed.weight"),
            ("lm_head.weight", "head.weight"),
            ("model.norm.weight", "norm.weight"),
            ("model.hc_head.hc_fn", "hc_head_fn"),
            (
                "model.layers.3.input_layernorm.weight",
                "layers.3.attn_norm.weight",
            ),
            (
                "model.layers.3.post_attention_layernorm.weight",
                "layers.3.ffn_norm.weight",
            ),
            ("model.layers.3.attn_hc.fn", "layers.3.hc_attn_fn"),
            ("model.layers.3.ffn_hc.scale", "layers.3.hc_ffn_scale"),
            ("model.layers.0.self_attn.sinks", "layers.0.attn.attn_sink"),
            (
                "model.layers.0.self_attn.q_a_proj.weight",
                "layers.0.attn.wq_a.weight",
            ),
            (
                "model.layers.0.self_attn.q_a_proj.scale",
                "layers.0.attn.wq_a.scale",
            ),
            (
                "model.layers.0.self_attn.q_a_norm.weight",
                "layers.0.attn.q_norm.weight",
            ),
            (
                "model.layers.0.self_attn.kv_norm.weight",
                "layers.0.attn.kv_norm.weight",
            ),
            (
                "model.layers.0.self_attn.o_a_proj.weight",
                "layers.0.attn.wo_a.weight",
            ),
            (
                "model.layers.1.self_attn.compressor.kv_proj.weight",
                "layers.1.attn.compressor.wkv.weight",
            ),
            (
                "model.layers.1.self_attn.compressor.gate_proj.weight",
                "layers.1.attn.compressor.wgate.weight",
            ),
            (
                "model.layers.1.self_attn.compressor.position_bias",
                "layers.1.attn.compressor.ape",
            ),
            (
                "model.layers.1.self_attn.compressor.kv_norm.weight",
                "layers.1.attn.compressor.norm.weight",
            ),
            (
                "model.layers.1.self_attn.compressor.indexer.kv_proj.weight",
                "layers.1.attn.indexer.compressor.wkv.weight",
            ),
            (
                "model.layers.1.self_attn.compressor.indexer.kv_norm.weight",
                "layers.1.attn.indexer.compressor.norm.weight",
            ),
            (
                "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight",
                "layers.1.attn.indexer.wq_b.weight",
            ),
            (
                "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight",
                "layers.1.attn.indexer.weights_proj.weight",
            ),
            ("model.layers.2.mlp.gate.weight", "layers.2.ffn.gate.weight"),
            (
                "model.layers.2.mlp.gate.e_score_correction_bias",
                "layers.2.ffn.gate.bias",
            ),
            ("model.layers.0.mlp.gate.tid2eid", "layers.0.ffn.gate.tid2eid"),
            (
                "model.layers.2.mlp.experts.7.gate_proj.weight",
                "layers.2.ffn.experts.7.w1.weight",
            ),
            (
                "model.layers.2.mlp.experts.7.up_proj.scale",
                "layers.2.ffn.experts.7.w3.scale",
            ),
            (
                "model.layers.2.mlp.experts.7.down_proj.weight",
                "layers.2.ffn.experts.7.w2.weight",
            ),
            (
                "model.layers.2.mlp.shared_experts.gate_proj.weight",
                "layers.2.ffn.shared_experts.w1.weight",
            ),
            (
                "model.layers.2.mlp.shared_experts.down_proj.weight",
                "layers.2.ffn.shared_experts.w2.weight",
            ),
        ] {
            assert_eq!(deepseek_v4(hf), published, "{hf}");
        }
    }
}
