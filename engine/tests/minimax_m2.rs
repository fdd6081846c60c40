//! MiniMax-M2 (`minimax_m2`) against HF `transformers` `MiniMaxM2ForCausalLM` (fixture
//! `minimax-m2-fp8/`: the published block-FP8 layout with `fmt: float8_e4m3fn`, Mixtral-style
//! `block_sparse_moe.experts.{e}.{w1,w3,w2}`, q/k RMSNorm over the whole projection, partial
//! rotary via `rotary_dim`, sigmoid routing with the correction bias), in memory and out of
//! core, with its tokenizer and published chat template.

mod golden_support;

use deltafin_engine::Error;
use deltafin_engine::arch;
use serde_json::Value;

const NAME: &str = "minimax-m2-fp8";

#[test]
fn minimax_m2_matches_hf_in_memory() {
    golden_support::check(NAME);
}

#[test]
fn minimax_m2_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core(NAME);
}

#[test]
fn minimax_m2_tokenizer_and_chat_template_match_hf() {
    golden_support::check_tokenizer(NAME);
}

#[test]
fn minimax_m2_is_batch_and_chunk_invariant_and_drafts_change_nothing() {
    golden_support::check_consistency(NAME);
}

/// A copy of the fixture with its config edited.
fn with_config(edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    golden_support::with_config(NAME, edit)
}

#[test]
fn semantic_keys_the_code_does_not_implement_are_refused_by_name() {
    for (key, value) in [
        ("attn_type_list", serde_json::json!([1, 0, 1])),
        ("scoring_func", "softmax".into()),
        ("qk_norm_type", "per_head".into()),
        ("shared_intermediate_size", 64.into()),
    ] {
        let dir = with_config(|c| c[key] = value.clone());
        let err = arch::load(dir.path()).unwrap_err();
        assert!(
            matches!(&err, Error::Config { field, .. } if field == key),
            "{key}: {err}"
        );
    }
    let dir = with_config(|c| c["quantization_config"]["fmt"] = "float8_e5m2".into());
    let err = arch::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("quantization_config.fmt"), "{err}");
}

#[test]
fn a_missing_scale_or_a_wrong_block_shape_names_the_tensor() {
    let dir = with_config(|c| c["quantization_config"]["weight_block_size"] = serde_json::json!([16, 16]));
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::TensorShape { name, .. } if name.ends_with("weight_scale_inv")),
        "{err}"
    );
    let dir = with_config(|c| {
        c["quantization_config"] = serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]})
    });
    let scale = "model.layers.2.block_sparse_moe.experts.5.w2.weight_scale_inv";
    golden_support::alter_tensor(dir.path(), scale, None);
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::MissingTensor { name, .. } if name == scale),
        "{err}"
    );
}
