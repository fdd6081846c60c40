//! Grammars against a real (tiny, byte-level K3-flavoured) tokenizer: the mask admits exactly
//! the continuations the grammar allows, specials are reachable only by id, and an output walked
//! under the mask is valid.

use std::sync::Arc;

use super::*;
use crate::generate::{ConstraintFactory, TokenConstraint};
use crate::synth::{TokenizerFlavor, write_byte_tokenizer_flavor};

fn vocab() -> (Arc<Tokenizer>, Vocabulary) {
    let dir = tempfile::tempdir().unwrap();
    let n = write_byte_tokenizer_flavor(dir.path(), TokenizerFlavor::K3).unwrap();
    let tok = Arc::new(Tokenizer::from_dir(dir.path()).unwrap());
    // Pad like a model whose embedding is larger than the tokenizer.
    let v = Vocabulary::new(tok.clone(), n + 64, &[]).unwrap();
    (tok, v)
}

/// Walk greedily under the mask with logits that prefer a fixed pseudo-random order.
fn walk(c: &mut dyn TokenConstraint, vocab: usize, eos: u32, steps: usize) -> Vec<u32> {
    let mut out = Vec::new();
    for step in 0..steps {
        let mut logits: Vec<f32> = (0..vocab)
            .map(|i| ((i * 7919 + step * 104_729) % 1000) as f32)
            .collect();
        c.mask(&mut logits).unwrap();
        let t = crate::kernels::ops::argmax(&logits) as u32;
        c.accept(t).unwrap();
        out.push(t);
        if t == eos {
            break;
        }
    }
    out
}

#[test]
fn a_json_schema_walk_gives_valid_json() {
    let (tok, v) = vocab();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "tag": {"enum": ["a", "b"]},
        },
        "required": ["ok", "n", "tag"],
        "additionalProperties": false,
    });
    let g = v.json_schema(schema).unwrap();
    let mut c = g.start().unwrap();
    let eos = tok.eos_id().unwrap();
    let out = walk(c.as_mut(), tok.vocab_size() + 64, eos, 200);
    let text = tok.decode(&out[..out.len() - usize::from(out.last() == Some(&eos))]);
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(
        value["ok"].is_boolean() && value["n"].is_u64() && value["tag"].is_string(),
        "{text}"
    );
}

#[test]
fn special_tokens_are_reachable_only_by_id() {
    let (tok, v) = vocab();
    let open = tok.token_to_id("<|open|>").unwrap();
    let g = v.lark(&format!("start: \"x\" <[{open}]>")).unwrap();
    let x = tok.encode("x");
    assert!(g.accepts_prefix(&x).unwrap());
    let mut with_open = x.clone();
    with_open.push(open);
    assert!(g.accepts_prefix(&with_open).unwrap());
    // The marker's text spelled in plain bytes is not the marker.
    let mut spelled = x.clone();
    spelled.extend(tok.encode("<|open|>"));
    assert!(!g.accepts_prefix(&spelled).unwrap());
}

#[test]
fn padded_ids_are_never_allowed_and_bad_grammars_are_typed_errors() {
    let (tok, v) = vocab();
    let g = v.lark("start: /[a-z]+/").unwrap();
    let mut c = g.start().unwrap();
    let mut logits = vec![0.0f32; tok.vocab_size() + 64];
    c.mask(&mut logits).unwrap();
    assert!(logits[tok.vocab_size()..].iter().all(|x| *x == f32::NEG_INFINITY));
    assert!(logits[tok.encode("q")[0] as usize].is_finite());
    let err = v.lark("start: undefined_rule").unwrap_err();
    assert_eq!(err.kind(), "constraint");
    let err = v
        .json_schema(serde_json::json!({"type": "no-such-type"}))
        .unwrap_err();
    assert_eq!(err.kind(), "constraint", "{err}");
}

#[test]
fn the_greedy_fast_path_picks_what_the_full_mask_picks() {
    use crate::generate::{DecodeOptions, Decoder, Sampling};
    let (tok, v) = vocab();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"a": {"type": "string", "maxLength": 6}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    });
    let g = v.json_schema(schema).unwrap();
    let n = tok.vocab_size() + 64;
    // With logprobs requested the decoder always computes the whole mask.
    let opts = |logprobs| DecodeOptions {
        constraint: Some(g.clone() as Arc<dyn ConstraintFactory>),
        logprobs,
        ..Default::default()
    };
    let mut fast = Decoder::new(Sampling::Greedy, opts(None), &[]).unwrap();
    let mut full = Decoder::new(Sampling::Greedy, opts(Some(0)), &[]).unwrap();
    let eos = tok.eos_id().unwrap();
    let mut fast_hits = 0;
    for step in 0..120 {
        // Logits that often favour JSON-ish bytes, so both paths get exercised.
        let logits: Vec<f32> = (0..n)
            .map(|i| {
                let bonus = if b"{}\":,0123456789ab ".contains(&(i as u8)) && i < 256 {
                    3.0
                } else {
                    0.0
                };
                ((i * 7919 + step * 104_729) % 1000) as f32 / 300.0 + bonus
            })
            .collect();
        let a = fast.pick(&logits, step).unwrap().token;
        let b = full.pick(&logits, step).unwrap().token;
        assert_eq!(a, b, "step {step}");
        let (_, rows_before) = fast.mask_time();
        fast.accept(a).unwrap();
        full.accept(b).unwrap();
        fast_hits += usize::from(rows_before > 0);
        if a == eos {
            break;
        }
    }
    assert!(fast_hits > 0);
}

#[test]
fn a_reasoning_budget_forces_the_close_once_spent_and_then_lifts() {
    let (tok, v) = vocab();
    let close = tok.token_to_id("<|close|>").unwrap();
    let free = format!("<[^{close}]>*");
    let g = v
        .lark(&format!("start: think <[{close}]> \"ok\"\nthink: {free}"))
        .unwrap();
    let budgeted = g.with_reasoning_budget(ReasoningBudget::half_of(6, close));
    let n = tok.vocab_size() + 64;
    let mut c = budgeted.start().unwrap();
    let a = tok.encode("a")[0];
    for _ in 0..3 {
        assert_eq!(c.allows(a).unwrap(), Some(true));
        c.accept(a).unwrap();
    }
    // Three tokens of reasoning spent: only the close is allowed, by the mask and the fast path.
    let mut logits = vec![0.0f32; n];
    c.mask(&mut logits).unwrap();
    let allowed: Vec<usize> = (0..n).filter(|&i| logits[i].is_finite()).collect();
    assert_eq!(allowed, [close as usize]);
    assert_eq!(c.allows(a).unwrap(), None, "the fast path defers to the mask");
    c.accept(close).unwrap();
    // After the close the grammar alone decides again.
    let mut logits = vec![0.0f32; n];
    c.mask(&mut logits).unwrap();
    assert!(logits[tok.encode("o")[0] as usize].is_finite());
    // Unbudgeted, the reasoning may go on.
    let mut c = g.start().unwrap();
    for _ in 0..10 {
        c.accept(a).unwrap();
    }
    assert_eq!(c.allows(a).unwrap(), Some(true));
}

/// A stop token the grammar's free text would admit is allowed only where it completes the
/// grammar: mid-reasoning it is masked (and the fast path defers to the mask), at the end it is
/// the answer's last token.
#[test]
fn a_stop_token_is_allowed_only_where_it_completes_the_grammar() {
    let (tok, v) = vocab();
    let (close, stop) = (
        tok.token_to_id("<|close|>").unwrap(),
        tok.token_to_id("[EOS]").unwrap(),
    );
    let g = v
        .lark(&format!(
            "start: think <[{close}]> \"ok\" <[{stop}]>\nthink: <[^{close}]>*"
        ))
        .unwrap();
    let n = tok.vocab_size() + 64;
    let allowed = |c: &mut Box<dyn TokenConstraint>| {
        let mut logits = vec![0.0f32; n];
        c.mask(&mut logits).unwrap();
        logits[stop as usize].is_finite()
    };
    // Without stop ids the reasoning admits it (and generation would end there).
    let mut plain = g.start().unwrap();
    assert!(allowed(&mut plain));
    let mut c = g.with_stop_ids(&[stop]).start().unwrap();
    let a = tok.encode("a")[0];
    c.accept(a).unwrap();
    assert!(!allowed(&mut c), "a stop inside the reasoning");
    assert_eq!(c.allows(stop).unwrap(), None);
    assert_eq!(
        c.allows(a).unwrap(),
        Some(true),
        "checking the stop left the matcher as it was"
    );
    c.accept(close).unwrap();
    for t in tok.encode("ok") {
        assert!(!allowed(&mut c));
        c.accept(t).unwrap();
    }
    assert!(allowed(&mut c), "the stop that completes the grammar");
    c.accept(stop).unwrap();
}
