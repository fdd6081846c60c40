//! Golden tests for Kimi-Linear and Kimi K3 on tiny random checkpoints in their real on-disk
//! formats, against independent oracles (see `fixtures/README-kimi.md`; CI compares, it never
//! regenerates):
//! * `kimi-linear/`: HF transformers `KimiLinearForCausalLM`, float32, eager, PyTorch fallback;
//! * `k3/`: a float64 NumPy reference written from `reference/kimi-k3.md` (its KDA recurrence
//!   cross-checked against fla-core's naive KDA).
//!
//! Same approach as `golden.rs`: named hidden states (`embed`, `layers.{i}`, `norm`; for K3
//! `layers.{i}` is the within-block running sum `h`) and logits with a max-abs error relative to
//! the tensor's scale; the oracle's whole greedy path (24 tokens) must be reproduced exactly.
//! The MXFP4 probes of the K3 fixture are compared element for element (exact decode).

use std::path::PathBuf;

use deltafin_engine::arch::ModelSpec;
use deltafin_engine::arch::{self, Loader, LogitRows, SeqInput, Trace};
use deltafin_engine::generate::{Flow, GenerateOptions, Sampling, generate};
use deltafin_engine::kernels::reference::decode_row;
use deltafin_engine::weights::WeightIndex;
use serde_json::Value;

/// Max |ours - oracle| / max(1, max |oracle|) per named tensor (as `golden.rs`).
const REL_TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn golden(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixture(name).join("golden.json")).unwrap()).unwrap()
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
    let dir = fixture(name);
    let golden = golden(name);
    let model = arch::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
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
    let hidden = golden["hidden_states"].as_object().unwrap();
    assert_eq!(
        hidden.len(),
        trace.tensors.len(),
        "{name}: traced tensors {:?}",
        trace.tensors.keys()
    );
    let mut report = Vec::new();
    for (key, value) in hidden {
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
        |_| Flow::Continue,
    )
    .unwrap();
    assert_eq!(
        got.output_ids, want,
        "{name}: greedy tokens differ from the oracle"
    );
}

#[test]
fn kimi_linear_hf_oracle() {
    check("kimi-linear");
}

#[test]
fn kimi_k3_numpy_reference_mxfp4_attn_res() {
    check("k3");
}

#[test]
fn kimi_k3_mxfp4_probes_decode_exactly() {
    let dir = fixture("k3");
    let spec = ModelSpec::load(&dir).unwrap();
    let index = WeightIndex::open(&dir).unwrap();
    let loader = Loader::new(&index, &spec);
    let probes = golden("k3")["mxfp4"]["probes"].as_array().unwrap().clone();
    assert!(!probes.is_empty());
    for probe in probes {
        let tensor = probe["tensor"].as_str().unwrap();
        let module = tensor.strip_prefix(&spec.tensor_prefix).unwrap();
        let packed = index.info(&format!("{tensor}.weight_packed")).unwrap();
        let (rows, cols) = (packed.shape[0], packed.shape[1] * 2);
        let m = loader.linear(module, rows, cols).unwrap();
        let mut row = vec![0.0f32; cols];
        decode_row(&m, probe["row"].as_u64().unwrap() as usize, &mut row);
        let want = floats(&probe["dequant_row"]);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&row), bits(&want), "{tensor}");
    }
}
