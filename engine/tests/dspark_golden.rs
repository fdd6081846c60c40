//! The DSpark draft head against its independent oracle: `fixtures/k3-dspark/golden.json` was
//! computed by a float64 NumPy forward of the head written from `reference/kimi-k3.md` §5.4
//! (expanded attention, YaRN from the §5.4 formulas), fed by the float64 K3 reference's hidden
//! rows (`fixtures/gen_k3_dspark.py`). Here the real code paths run: the K3 fixture's pass is
//! traced for the head's target layers, the head builds its context from the captured rows, and
//! its block over `[anchor, MASK…]` must give the oracle's logits (within `REL_TOL`) and exactly
//! its proposal (the generator keeps only weights whose top-1 margin is ≥ 1e-3).

use std::path::PathBuf;
use std::sync::Arc;

use deltafin_engine::arch::{self, LogitRows, SeqInput, Trace};
use deltafin_engine::spec::dspark::DSpark;
use deltafin_engine::spec::{Observation, Proposer};
use serde_json::Value;

const REL_TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn draft_head_block_matches_the_float64_oracle() {
    let golden: Value =
        serde_json::from_slice(&std::fs::read(fixture("k3-dspark/golden.json")).unwrap()).unwrap();
    let ids: Vec<u32> = golden["context_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let anchor = golden["anchor"].as_u64().unwrap() as u32;
    let want: Vec<u32> = golden["proposal"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let oracle: Vec<f32> = golden["block_logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32))
        .collect();

    let model = arch::load(&fixture("k3")).unwrap();
    let head = Arc::new(DSpark::load(&fixture("k3-dspark")).unwrap());
    head.check_target(model.as_ref()).unwrap();
    let mut session = head.session(8192);
    let names = session.captures().to_vec();
    let mut state = model.new_state();
    let mut trace = Trace::capture(&names);
    let logits = model
        .forward(
            &mut [SeqInput {
                state: &mut state,
                tokens: &ids,
                logits: LogitRows::Last,
            }],
            Some(&mut trace),
        )
        .unwrap();
    let target_next = deltafin_engine::kernels::ops::argmax(&logits) as u32;
    assert_eq!(
        target_next, anchor,
        "the K3 fixture's greedy next token is the oracle's anchor"
    );
    let hidden = trace.rows(&names, 0, ids.len(), model.info().hidden_size);
    session
        .observe(
            model.as_ref(),
            &Observation {
                start: 0,
                tokens: &ids,
                hidden: &hidden,
            },
        )
        .unwrap();
    let (ours, tokens) = session.block(model.as_ref(), anchor).unwrap();
    assert_eq!(ours.len(), oracle.len());
    let scale = oracle.iter().fold(1.0f32, |m, x| m.max(x.abs()));
    let err = ours
        .iter()
        .zip(&oracle)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale;
    assert!(err <= REL_TOL, "block logits: relative max error {err:e}");
    assert_eq!(tokens, want, "proposal differs from the oracle");
    // The proposer returns the first `max` of those tokens.
    let mut history = ids.clone();
    history.push(anchor);
    let p = session.propose(model.as_ref(), &history, 3).unwrap();
    assert_eq!(p.tokens, want[..3]);
}

/// Committed rows are buffered and projected in one pass when a proposal needs them: observing
/// position by position with a proposal after each, observing everything then proposing once,
/// and observing in uneven chunks (crossing the buffer's flush size) give bit-identical blocks.
#[test]
fn buffered_context_rows_give_the_same_block_as_per_step_updates() {
    let model = arch::load(&fixture("k3")).unwrap();
    let head = Arc::new(DSpark::load(&fixture("k3-dspark")).unwrap());
    let names = head.session(8192).captures().to_vec();
    let ids: Vec<u32> = (0..150u32).map(|i| (i * 37 + 11) % 200).collect();
    let mut state = model.new_state();
    let mut trace = Trace::capture(&names);
    let tokens = &ids[..];
    let inputs = &mut [SeqInput {
        state: &mut state,
        tokens,
        logits: LogitRows::None,
    }];
    model.forward(inputs, Some(&mut trace)).unwrap();
    let h = model.info().hidden_size;
    let observe = |s: &mut deltafin_engine::spec::dspark::DSparkSession, a: usize, b: usize| {
        let hidden = trace.rows(&names, a, b - a, h);
        let obs = Observation {
            start: a,
            tokens: &ids[a..b],
            hidden: &hidden,
        };
        s.observe(model.as_ref(), &obs).unwrap();
    };
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let anchor = 7;

    let mut stepwise = head.session(8192);
    for i in 0..ids.len() {
        observe(&mut stepwise, i, i + 1);
        let mut history = ids[..=i].to_vec();
        history.push(anchor);
        stepwise.propose(model.as_ref(), &history, 2).unwrap();
    }
    let want = bits(stepwise.block(model.as_ref(), anchor).unwrap().0);

    let mut at_once = head.session(8192);
    observe(&mut at_once, 0, ids.len());
    assert_eq!(bits(at_once.block(model.as_ref(), anchor).unwrap().0), want);

    let mut chunked = head.session(8192);
    for (a, b) in [(0, 3), (3, 70), (70, 71), (71, 150)] {
        observe(&mut chunked, a, b);
    }
    assert_eq!(chunked.observed(), ids.len());
    assert_eq!(bits(chunked.block(model.as_ref(), anchor).unwrap().0), want);
}

#[test]
fn a_config_field_the_format_does_not_have_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("k3-dspark").join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(fixture("k3-dspark/config.json")).unwrap()).unwrap();
    cfg["use_fancy_gate"] = Value::Bool(true);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let err = DSpark::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("use_fancy_gate"), "{err}");
    cfg.as_object_mut().unwrap().remove("use_fancy_gate");
    cfg["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let err = DSpark::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("architectures"), "{err}");
}

#[test]
fn a_head_made_for_another_target_is_refused() {
    let head = DSpark::load(&fixture("k3-dspark")).unwrap();
    let other = arch::load(&fixture("kimi-linear")).unwrap();
    let err = head.check_target(other.as_ref()).unwrap_err().to_string();
    assert!(err.contains("hidden_size") || err.contains("vocab_size"), "{err}");
}
