//! DeepSeek-V3.2 (`deepseek_v32`) against HF `transformers` `DeepseekV32ForCausalLM` (fixture
//! `dsv32-dsa-bf16/`: MLA with Q-LoRA and a lightning indexer on every layer whose RoPE rotates
//! halves, `index_topk` 10 against a 52-token prompt and its continuation; BF16 weights sharded in
//! two files, group-limited sigmoid routing, a dense first layer, a shared expert), in memory and
//! out of core, with the exactness properties every family has.

mod golden_support;

#[test]
fn dsv32_dsa_bf16_matches_hf_in_memory() {
    golden_support::check("dsv32-dsa-bf16");
}

#[test]
fn dsv32_dsa_bf16_gives_hf_ids_under_every_memory_budget() {
    golden_support::check_out_of_core("dsv32-dsa-bf16");
}

/// The prompt is HF's `tokenizer(text)` (BOS added, as DeepSeek's tokenizer does), and every
/// tokenizer case encodes as HF's with and without added specials.
#[test]
fn dsv32_prompt_and_tokenizer_match_hf() {
    use golden_support::ids;
    let dir = golden_support::fixture("dsv32-dsa-bf16");
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let t = deltafin_engine::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let text = golden["prompt_text"].as_str().unwrap();
    assert_eq!(t.encode_prompt(text), ids(&golden["prompt_ids"]));
    for case in golden["tokenizer"]["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(t.encode_with_special(text), ids(&case["ids"]), "{text:?}");
        assert_eq!(
            t.encode_prompt(text),
            ids(&case["ids_add_special_tokens"]),
            "{text:?}"
        );
    }
}

#[test]
fn dsv32_chunking_batching_prefix_reuse_and_drafts_are_exact() {
    golden_support::check_consistency("dsv32-dsa-bf16");
}
