//! Golden tests: tiny random checkpoints in the real on-disk formats, compared against the
//! independent oracle (HF transformers, float32, eager attention and experts) that generated
//! `fixtures/<name>/golden.json` (see fixtures/README.md; CI compares, it never regenerates).
//! Tolerances and the comparison: `golden_support`.

mod golden_support;

use std::path::PathBuf;

use golden_support::{check, check_dir, ids};
use serde_json::Value;

/// The built-in default (trained weights: outlier features, peaked attention, routing with
/// locality), 64 greedy tokens against HF on the files the binary ships.
#[test]
fn trained_default_model_matches_hf_for_64_tokens() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/austen-moe");
    check_dir("austen-moe", &dir);
    let golden: Value = serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    assert!(ids(&golden["greedy"]["output_ids"]).len() >= 64);
}

#[test]
fn deepseek_v3_bf16_sharded_yarn_group_limited() {
    check("dsv3-bf16");
}

#[test]
fn kimi_k25_nested_int4_experts() {
    check("k2-int4");
}

#[test]
fn kimi_k2_instruct_block_fp8_partial_blocks() {
    check("k2-fp8");
}

#[test]
fn qwen3_dense_drafter_tied_gqa() {
    check("qwen3");
}
