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
