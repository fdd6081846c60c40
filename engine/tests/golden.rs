//! Golden tests: tiny random checkpoints in the real on-disk formats, compared against the
//! independent oracle (HF transformers, float32, eager attention and experts) that generated
//! `fixtures/<name>/golden.json` (see fixtures/README.md; CI compares, it never regenerates).
//!
//! Tolerances: both sides compute in f32 but in different orders (HF expands MLA keys per head;
//! we use the absorbed latent form; reduction orders differ), so named hidden states and logits
//! are compared with a max-abs error relative to the tensor's scale (`REL_TOL`). Greedy tokens
//! must be identical over the oracle's whole greedy path (≥ 16 tokens); the generators reject
//! fixtures whose top-1 margin along that path is below 1e-3, far above the observed error.

use std::path::PathBuf;

use deltafin_engine::arch::{self, LogitRows, SeqInput, Trace};
use deltafin_engine::generate::{GenerateOptions, Sampling, generate};
use serde_json::Value;

/// Max |ours - oracle| / max(1, max |oracle|) per named tensor.
const REL_TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn floats(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(a) => a.iter().flat_map(floats).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap() as f32],
        other => panic!("unexpected value {other}"),
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn compare(name: &str, ours: &[f32], oracle: &[f32]) -> f32 {
    assert_eq!(ours.len(), oracle.len(), "{name}: length");
    let scale = oracle.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let err = ours
        .iter()
        .zip(oracle)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale;
    assert!(err <= REL_TOL, "{name}: relative max error {err:e} > {REL_TOL:e}");
    err
}

fn check(name: &str) {
    check_dir(name, &fixture(name));
}

fn check_dir(name: &str, dir: &std::path::Path) {
    let golden: Value = serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let model = arch::load(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let prompt = ids(&golden["prompt_ids"]);
    let mut state = model.new_state();
    let mut trace = Trace::default();
    let logits = model
        .forward(
            &mut [SeqInput {
                state: &mut state,
                tokens: &prompt,
                logits: LogitRows::All,
            }],
            Some(&mut trace),
        )
        .unwrap();
    let mut report = Vec::new();
    for (key, value) in golden["hidden_states"].as_object().unwrap() {
        let ours = trace
            .tensors
            .get(key)
            .unwrap_or_else(|| panic!("{name}: no traced tensor `{key}`"));
        report.push(format!(
            "{key} {:.1e}",
            compare(&format!("{name} {key}"), ours, &floats(value))
        ));
    }
    report.push(format!(
        "logits {:.1e}",
        compare(&format!("{name} logits"), &logits, &floats(&golden["logits"]))
    ));
    eprintln!("{name}: {}", report.join(", "));

    let greedy = &golden["greedy"];
    let want = ids(&greedy["output_ids"]);
    assert!(want.len() >= 16, "{name}: oracle path too short");
    let opts = GenerateOptions {
        max_new_tokens: want.len(),
        sampling: Sampling::Greedy,
        stop_ids: vec![],
        prefill_chunk: 5,
    };
    let mut state = model.new_state();
    let got = generate(
        model.as_ref(),
        &mut state,
        &ids(&greedy["prompt_ids"]),
        &opts,
        |_| deltafin_engine::generate::Flow::Continue,
    )
    .unwrap();
    assert_eq!(
        got.output_ids, want,
        "{name}: greedy tokens differ from the oracle"
    );
}

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
