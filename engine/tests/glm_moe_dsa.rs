//! GLM-5 (`glm_moe_dsa`) against HF `transformers` `GlmMoeDsaForCausalLM` (fixture
//! `glm5-dsa-fp8/`: MLA with Q-LoRA and DeepSeek Sparse Attention, a lightning indexer on layers
//! 0 and 2 and layers 1 and 3 sharing its choice, `index_topk` 12 against a 58-token prompt and
//! its continuation; block FP8 with partial edge blocks, per-expert tensors, a dense first
//! layer, sigmoid routing with correction bias, a shared expert, and the unused MTP layer), in
//! memory and out of core, with the exactness properties every family has.

mod golden_support;

#[test]
fn glm5_dsa_fp8_matches_hf_in_memory() {
    golden_support::check("glm5-dsa-fp8");
}

#[test]
fn glm5_dsa_fp8_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core("glm5-dsa-fp8");
}

#[test]
fn glm5_tokenizer_and_chat_template_match_hf() {
    golden_support::check_tokenizer("glm5-dsa-fp8");
}

#[test]
fn glm5_chunking_batching_prefix_reuse_and_drafts_are_exact() {
    golden_support::check_consistency("glm5-dsa-fp8");
}
