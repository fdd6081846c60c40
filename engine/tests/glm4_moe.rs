//! GLM-4.5 (`glm4_moe`) against HF `transformers` `Glm4MoeForCausalLM` (fixture
//! `glm4-moe-fp8/`: the published block-FP8 layout with `weight_scale_inv`, per-expert tensors,
//! attention biases, q/k norm, partial rotary, a dense first layer, shared experts, sigmoid
//! routing with correction bias, and the unused MTP layer), in memory and out of core.

mod golden_support;

#[test]
fn glm4_moe_fp8_matches_hf_in_memory() {
    golden_support::check("glm4-moe-fp8");
}

#[test]
fn glm4_moe_fp8_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core("glm4-moe-fp8");
}

#[test]
fn glm4_moe_tokenizer_and_chat_template_match_hf() {
    golden_support::check_tokenizer("glm4-moe-fp8");
}
