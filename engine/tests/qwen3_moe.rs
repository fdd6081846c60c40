//! Qwen3-MoE (`qwen3_moe`) against HF `transformers` `Qwen3MoeForCausalLM` (fixture
//! `qwen3-moe/`: BF16, the published per-expert layout, a dense `mlp_only_layers` layer, GQA
//! with q/k norm, softmax routing with `norm_topk_prob`), in memory and out of core.

mod golden_support;

#[test]
fn qwen3_moe_matches_hf_in_memory() {
    golden_support::check("qwen3-moe");
}

#[test]
fn qwen3_moe_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core("qwen3-moe");
}

#[test]
fn qwen3_moe_tokenizer_and_chat_template_match_hf() {
    golden_support::check_tokenizer("qwen3-moe");
}

/// A Qwen3-MoE checkpoint can be the raw-completion drafter (`--draft-qwen`); an architecture
/// that cannot is refused with its `model_type` named.
#[test]
fn qwen3_moe_is_accepted_as_a_raw_completion_drafter() {
    use std::sync::Arc;

    use deltafin_engine::spec::qwen::{QwenDraftConfig, QwenDrafter};
    use deltafin_engine::tokenizer::Tokenizer;
    let target = golden_support::fixture("dsv3-bf16");
    let tokenizer = Arc::new(Tokenizer::from_dir(&target).unwrap());
    let drafter = golden_support::fixture("qwen3-moe");
    assert!(QwenDrafter::load(&drafter, tokenizer.clone(), QwenDraftConfig::default()).is_ok());
    let err = QwenDrafter::load(&target, tokenizer, QwenDraftConfig::default()).unwrap_err();
    assert!(err.to_string().contains("deepseek_v3"), "{err}");
}
