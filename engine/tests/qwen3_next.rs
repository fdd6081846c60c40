//! Qwen3-Next (`qwen3_next`) and Qwen3.5-MoE (`qwen3_5_moe`) against HF `transformers`
//! (`Qwen3NextForCausalLM`, `Qwen3_5MoeForConditionalGeneration`): fixtures `qwen3-next/`
//! (BF16, per-expert names, fused `in_proj_qkvz`/`in_proj_ba`, one dense layer),
//! `qwen3.5-moe/` (BF16 as `save_pretrained` writes the vision-language wrapper: fused
//! experts, `model.language_model.` names, a vision tower and MTP layers the engine skips) and
//! `qwen3.5-moe-fp8/` (the published block-FP8 layout, per-expert names); in memory and out of
//! core, batch and chunk invariant, with the tokenizer and published chat template.

mod golden_support;

use deltafin_engine::Error;
use deltafin_engine::arch;

const NEXT: &str = "qwen3-next";
const QWEN35: &str = "qwen3.5-moe";
const QWEN35_FP8: &str = "qwen3.5-moe-fp8";
const ALL: [&str; 3] = [NEXT, QWEN35, QWEN35_FP8];

#[test]
fn qwen3_next_and_qwen35_match_hf_in_memory() {
    for name in ALL {
        golden_support::check(name);
    }
}

#[test]
fn qwen3_next_and_qwen35_give_hf_ids_under_every_memory_budget() {
    for name in ALL {
        golden_support::check_out_of_core(name);
    }
}

#[test]
fn qwen3_next_and_qwen35_tokenizer_and_chat_template_match_hf() {
    for name in ALL {
        golden_support::check_tokenizer(name);
    }
}

#[test]
fn qwen3_next_and_qwen35_are_batch_and_chunk_invariant_and_drafts_change_nothing() {
    for name in ALL {
        golden_support::check_consistency(name);
    }
}

#[test]
fn unknown_layer_types_and_unimplemented_keys_are_refused_by_name() {
    let cases = [
        (
            "layer_types",
            serde_json::json!([
                "linear_attention",
                "sliding_attention",
                "linear_attention",
                "full_attention"
            ]),
        ),
        (
            "layer_types",
            serde_json::json!(["linear_attention", "full_attention"]),
        ),
        ("hidden_act", "gelu".into()),
        ("linear_value_head_dim", 32.into()),
        ("linear_num_value_heads", 3.into()),
    ];
    for (key, value) in cases {
        let dir = golden_support::with_config(NEXT, |c| c[key] = value.clone());
        let err = arch::load(dir.path()).unwrap_err();
        assert!(
            matches!(&err, Error::Config { field, .. } if field == key),
            "{key}: {err}"
        );
    }
    // The nested release names the key under its text config.
    let dir = golden_support::with_config(QWEN35, |c| c["text_config"]["layer_types"][0] = "mamba".into());
    let err = arch::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("text_config.layer_types"), "{err}");
}

#[test]
fn a_missing_scale_a_wrong_block_or_a_misshapen_fused_expert_names_the_tensor() {
    let scale = "model.language_model.layers.1.mlp.experts.3.down_proj.weight_scale_inv";
    let dir = golden_support::with_tensor(QWEN35_FP8, scale, None);
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::MissingTensor { name, .. } if name == scale),
        "{err}"
    );

    let dir = golden_support::with_config(QWEN35_FP8, |c| {
        c["quantization_config"]["weight_block_size"] = serde_json::json!([16, 16])
    });
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::TensorShape { name, .. } if name.ends_with("weight_scale_inv")),
        "{err}"
    );

    let fused = "model.language_model.layers.2.mlp.experts.gate_up_proj";
    let dir = golden_support::with_tensor(QWEN35, fused, Some(&[8, 32, 128]));
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::TensorShape { name, .. } if name == fused),
        "{err}"
    );

    let conv = "model.layers.0.linear_attn.conv1d.weight";
    let dir = golden_support::with_tensor(NEXT, conv, Some(&[128, 4, 1]));
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::TensorShape { name, .. } if name == conv),
        "{err}"
    );
}

#[test]
fn the_vision_tower_and_mtp_layers_are_not_read() {
    // Dropping every `model.visual.` and `mtp.` tensor changes nothing: the text decoder never
    // reads them.
    let dir = golden_support::copy_fixture(QWEN35);
    let index = deltafin_engine::weights::WeightIndex::open(dir.path()).unwrap();
    let skipped: Vec<String> = index
        .names()
        .filter(|n| n.starts_with("model.visual.") || n.starts_with("mtp."))
        .map(String::from)
        .collect();
    drop(index);
    assert!(
        skipped.iter().any(|n| n.starts_with("mtp.")) && skipped.len() > 20,
        "{skipped:?}"
    );
    for name in &skipped {
        golden_support::alter_tensor(dir.path(), name, None);
    }
    golden_support::check_dir(QWEN35, dir.path());
}

#[test]
fn the_residency_plan_states_the_tensors_it_does_not_read() {
    let mut o = deltafin_engine::cache::OocOptions::with_budget(u64::MAX / 4);
    o.reserve_bytes = 0;
    let (_, rt) = arch::load_budgeted(&golden_support::fixture(QWEN35), &o).unwrap();
    let groups: Vec<&str> = rt.plan.unread.groups.iter().map(|(g, _)| g.as_str()).collect();
    assert_eq!(
        groups,
        [
            "model.visual",
            "mtp.fc",
            "mtp.layers",
            "mtp.norm",
            "mtp.pre_fc_norm_embedding",
            "mtp.pre_fc_norm_hidden"
        ]
    );
    let (_, rt) = arch::load_budgeted(&golden_support::fixture(NEXT), &o).unwrap();
    assert_eq!(
        rt.plan.unread,
        Default::default(),
        "Qwen3-Next reads every tensor it ships"
    );
}
