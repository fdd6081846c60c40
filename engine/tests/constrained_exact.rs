//! Constrained decoding, penalties, `n` choices and log-probabilities keep every invariant, on the
//! built-in Kimi K3 model through the real engine loop: a request's ids are the same alone, in a
//! batch of 8, with drafts forced on (n-gram prompt lookup and the DSpark head) or off, and with
//! state reuse; a JSON-schema constraint gives valid JSON; choice 0 of `n` equals the request
//! alone and choice `i` equals the request alone with `choice_seed(seed, i)`; greedy
//! `top_logprobs[0]` is the chosen token.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use deltafin_engine::arch;
use deltafin_engine::constrain::Vocabulary;
use deltafin_engine::generate::{DecodeOptions, Sampling, TokenLogprobs};
use deltafin_engine::scheduler::{
    self, Completion, Event, GenRequest, SchedulerConfig, SchedulerHandle, choice_seed,
};
use deltafin_engine::spec::{Drafts, EconomicsConfig, RequestKind, SpecMode};
use deltafin_engine::synth::{DSparkSynth, KimiK3Synth};
use deltafin_engine::tokenizer::Tokenizer;

struct Fixture {
    dir: tempfile::TempDir,
    tok: Arc<Tokenizer>,
    vocab: Arc<Vocabulary>,
    vocab_size: usize,
    eos: Vec<u32>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    KimiK3Synth::k3_builtin().write(dir.path()).unwrap();
    let model = arch::load(dir.path()).unwrap();
    let info = model.info().clone();
    let tok = Arc::new(Tokenizer::from_dir(dir.path()).unwrap());
    let vocab = Arc::new(Vocabulary::new(tok.clone(), info.vocab_size, &[]).unwrap());
    let mut eos = info.eos_token_ids.clone();
    eos.extend(tok.eos_id());
    Fixture {
        dir,
        tok,
        vocab,
        vocab_size: info.vocab_size,
        eos,
    }
}

fn engine(f: &Fixture, max_batch: usize, drafts: bool, reuse: bool) -> SchedulerHandle {
    let model = arch::load(f.dir.path()).unwrap();
    let drafts = if drafts {
        let head_dir = tempfile::tempdir().unwrap();
        DSparkSynth::for_target(model.info(), 5)
            .write(head_dir.path())
            .unwrap();
        let head = deltafin_engine::spec::dspark::DSpark::load(head_dir.path()).unwrap();
        Drafts {
            dspark: Some(Arc::new(head)),
            economics: EconomicsConfig {
                forced: true,
                max_width: 4,
                ..Default::default()
            },
            ..Default::default()
        }
    } else {
        Drafts::none()
    };
    let cfg = SchedulerConfig {
        max_batch,
        prefill_chunk: 7,
        prefill_chunk_solo: 7,
        state_cache_entries: if reuse { 16 } else { 0 },
        min_reuse_tokens: 2,
        drafts,
        ..Default::default()
    };
    scheduler::start(model, cfg).unwrap().0
}

const SCHEMA: &str = r#"{
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tag": {"enum": ["alpha", "beta", "gamma"]},
        "note": {"type": "string", "maxLength": 12}
    },
    "required": ["ok", "n", "tag", "note"],
    "additionalProperties": false
}"#;

fn request(f: &Fixture, i: usize, constrained: bool, spec: SpecMode) -> GenRequest {
    let text = format!("Request {i}: answer in JSON, request {i} of eight. a b a b a b");
    let sampling = if i.is_multiple_of(2) {
        Sampling::Greedy
    } else {
        Sampling::new(0.9, 0.95, 0, 17 + i as u64).unwrap()
    };
    let constraint = constrained.then(|| {
        let schema: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
        f.vocab.json_schema(schema).unwrap() as Arc<dyn deltafin_engine::generate::ConstraintFactory>
    });
    GenRequest {
        prompt: f.tok.encode(&text),
        max_new_tokens: 120,
        sampling,
        stop_ids: f.eos.clone(),
        reuse_state: true,
        kind: if i % 4 < 2 {
            RequestKind::Chat
        } else {
            RequestKind::Completion
        },
        spec,
        decode: DecodeOptions {
            constraint,
            presence_penalty: if i % 3 == 1 { 0.5 } else { 0.0 },
            repetition_penalty: if i % 3 == 2 { 1.3 } else { 1.0 },
            logit_bias: vec![((i * 37 % 200) as u32, 2.5)],
            logprobs: Some(3),
            ..Default::default()
        },
    }
}

type Output = (Vec<u32>, Vec<TokenLogprobs>, Completion);

fn drain(rx: &mpsc::Receiver<Event>) -> Output {
    let (mut ids, mut lps) = (Vec::new(), Vec::new());
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).expect("event") {
            Event::Started { .. } => {}
            Event::Logprobs(lp) => lps.push(lp),
            Event::Token(t) => ids.push(t),
            Event::Done(c) => return (ids, lps, c),
            Event::Failed { kind, message } => panic!("failed ({kind}): {message}"),
        }
    }
}

fn run_all(h: &SchedulerHandle, reqs: &[GenRequest]) -> Vec<Output> {
    let rxs: Vec<_> = reqs
        .iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            h.submit(r.clone(), Box::new(tx)).unwrap();
            rx
        })
        .collect();
    rxs.iter().map(drain).collect()
}

fn json_of(f: &Fixture, ids: &[u32]) -> serde_json::Value {
    let body: Vec<u32> = ids.iter().copied().filter(|t| !f.eos.contains(t)).collect();
    let text = f.tok.decode(&body);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

#[test]
fn a_schema_constraint_gives_the_same_valid_json_alone_batched_drafted_and_reused() {
    let f = fixture();
    let plain: Vec<GenRequest> = (0..8).map(|i| request(&f, i, true, SpecMode::Off)).collect();
    let alone = engine(&f, 1, false, false);
    let reference: Vec<Output> = plain
        .iter()
        .map(|r| run_all(&alone, std::slice::from_ref(r)).remove(0))
        .collect();
    for (i, (ids, lps, done)) in reference.iter().enumerate() {
        let v = json_of(&f, ids);
        assert!(
            v["ok"].is_boolean() && v["n"].is_u64() && v["tag"].is_string(),
            "{i}: {v}"
        );
        assert!(
            v["note"].as_str().is_some_and(|s| s.chars().count() <= 12),
            "{i}: {v}"
        );
        assert_eq!(
            done.finish_reason,
            deltafin_engine::generate::FinishReason::Stop,
            "{i}"
        );
        assert_eq!(lps.len(), ids.len(), "one logprobs entry per token");
        if i.is_multiple_of(2) {
            for (lp, &id) in lps.iter().zip(ids) {
                assert_eq!(lp.top[0].0, id, "greedy picks the most likely allowed token");
                assert_eq!(lp.token, id);
            }
        }
    }
    let drafted: Vec<GenRequest> = (0..8).map(|i| request(&f, i, true, SpecMode::On)).collect();
    for (label, handle, reqs) in [
        ("batch of 8", engine(&f, 8, false, false), &plain),
        ("batch of 8, drafts forced", engine(&f, 8, true, false), &drafted),
        (
            "one at a time, drafts forced",
            engine(&f, 1, true, false),
            &drafted,
        ),
    ] {
        let got = run_all(&handle, reqs);
        for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
            assert_eq!(g.0, r.0, "{label}: request {i} ids");
            assert_eq!(g.1, r.1, "{label}: request {i} logprobs");
        }
        if label.contains("drafts") {
            let s = handle.stats().snapshot();
            assert!(s.rows > s.steps + 8, "{label}: drafts were verified ({s:?})");
            assert!(s.masked_rows > 0 && s.mask_nanos > 0, "{label}: masks were timed");
        }
    }
    // State reuse: each request continued (its prompt extended by its output and more text)
    // on an engine that kept the first round's states, against the continuation computed alone.
    let reuse = engine(&f, 2, true, true);
    let first = run_all(&reuse, &drafted);
    let next: Vec<GenRequest> = drafted
        .iter()
        .zip(&first)
        .map(|(r, out)| {
            let mut r = r.clone();
            r.prompt.extend(&out.0[..out.0.len() - 1]);
            r.prompt.extend(f.tok.encode(" and again:"));
            r
        })
        .collect();
    let again = run_all(&reuse, &next);
    for (i, (a, r)) in first.iter().zip(&reference).enumerate() {
        assert_eq!(a.0, r.0, "reuse engine, first round, request {i}");
    }
    for (i, (b, r)) in again.iter().zip(&next).enumerate() {
        let mut solo = r.clone();
        solo.spec = SpecMode::Off;
        assert_eq!(
            b.0,
            run_all(&alone, &[solo]).remove(0).0,
            "reused continuation {i}"
        );
        json_of(&f, &b.0);
    }
    let s = reuse.stats().snapshot();
    assert!(
        again.iter().any(|o| o.2.cached_tokens > 0),
        "the second round reused states: {s:?} {:?}",
        again.iter().map(|o| o.2).collect::<Vec<_>>()
    );
}

#[test]
fn n_choices_share_one_prefill_and_each_equals_its_request_alone() {
    let f = fixture();
    let alone = engine(&f, 1, false, false);
    let batched = engine(&f, 8, true, false);
    for (i, constrained) in [(1usize, false), (3, true)] {
        let req = request(&f, i, constrained, SpecMode::On);
        let sinks_rx: Vec<_> = (0..3).map(|_| mpsc::channel::<Event>()).collect();
        let (sinks, rxs): (Vec<_>, Vec<_>) = sinks_rx.into_iter().unzip();
        let sinks = sinks
            .into_iter()
            .map(|tx| Box::new(tx) as Box<dyn scheduler::EventSink>)
            .collect();
        let before = batched.stats().snapshot().prefilled;
        batched.submit_choices(req.clone(), sinks).unwrap();
        let outs: Vec<Output> = rxs.iter().map(drain).collect();
        let prefilled = batched.stats().snapshot().prefilled - before;
        assert_eq!(
            prefilled as usize,
            req.prompt.len(),
            "the prompt was prefilled once for 3 choices"
        );
        let Sampling::Random { seed, .. } = req.sampling else {
            unreachable!()
        };
        for (k, out) in outs.iter().enumerate() {
            let mut solo = req.clone();
            solo.sampling = req.sampling.with_seed(choice_seed(seed, k));
            solo.spec = SpecMode::Off;
            let want = run_all(&alone, &[solo]).remove(0);
            assert_eq!(out.0, want.0, "request {i} choice {k}");
            if constrained {
                json_of(&f, &out.0);
            }
        }
        assert_ne!(outs[0].0, outs[1].0, "seeded choices differ");
    }
    assert_eq!(choice_seed(42, 0), 42);
    assert!(f.vocab_size >= f.tok.vocab_size());
}
