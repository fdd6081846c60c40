//! Shared by the golden tests: a fixture's `golden.json` (from the independent oracle, HF
//! transformers) compared with the engine's traced hidden states, logits and greedy ids, and
//! the same greedy ids under every memory budget of the out-of-core loader.
//!
//! Tolerances: both sides compute in f32 but in different orders (HF expands MLA keys per head;
//! we use the absorbed latent form; reduction orders differ), so named hidden states and logits
//! are compared with a max-abs error relative to the tensor's scale (`REL_TOL`). Greedy tokens
//! must be identical over the oracle's whole greedy path (≥ 16 tokens); the generators reject
//! fixtures whose top-1 margin along that path is below 1e-3, far above the observed error.

#![allow(dead_code)]

mod edit;
#[allow(unused_imports)]
pub use edit::{alter_tensor, copy_fixture, with_config, with_tensor};

use std::path::PathBuf;

use deltafin_engine::arch::{self, LogitRows, SeqInput, Trace};
use deltafin_engine::generate::{GenerateOptions, Sampling, generate};
use serde_json::Value;

/// Max |ours - oracle| / max(1, max |oracle|) per named tensor.
pub const REL_TOL: f32 = 1e-4;

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn floats(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(a) => a.iter().flat_map(floats).collect(),
        Value::Number(n) => vec![n.as_f64().unwrap() as f32],
        other => panic!("unexpected value {other}"),
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn compare(name: &str, ours: &[f32], oracle: &[f32]) -> f32 {
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

pub fn check(name: &str) {
    check_dir(name, &fixture(name));
}

pub fn check_dir(name: &str, dir: &std::path::Path) {
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

/// The oracle's greedy path of fixture `name` under every budget of the out-of-core loader
/// (one expert slot with every layer streamed, up to everything resident; both read modes):
/// the same ids as HF, and all-row prompt logits bit-identical to the in-memory model.
pub fn check_out_of_core(name: &str) {
    use deltafin_engine::cache::{OocOptions, ReadMode};
    let dir = fixture(name);
    let golden: Value = serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let prompt = ids(&golden["greedy"]["prompt_ids"]);
    let want = ids(&golden["greedy"]["output_ids"]);
    let prompt_logits = |m: &dyn arch::Model| {
        let mut state = m.new_state();
        let inputs = &mut [SeqInput {
            state: &mut state,
            tokens: &prompt,
            logits: LogitRows::All,
        }];
        m.forward(inputs, None)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    let in_memory = prompt_logits(arch::load(&dir).unwrap().as_ref());
    let options = |budget: u64, mode: ReadMode| {
        let mut o = OocOptions::with_budget(budget);
        o.reader.mode = mode;
        o.reader.chunk_bytes = 4096;
        o.reserve_bytes = 0;
        o
    };
    let (_, rt) = arch::load_budgeted(&dir, &options(u64::MAX / 4, ReadMode::Auto)).unwrap();
    let p = &rt.plan;
    let max_layer = *p.layer_bytes.iter().max().unwrap();
    let floor = p.fixed_bytes + 2 * max_layer + p.slot_bytes;
    for budget in [floor, floor + 2 * p.slot_bytes, u64::MAX / 4] {
        for mode in [ReadMode::Auto, ReadMode::Buffered] {
            let (model, rt) = arch::load_budgeted(&dir, &options(budget, mode))
                .unwrap_or_else(|e| panic!("{name}: budget {budget}: {e}"));
            let what = format!("{name}: budget {budget} {mode:?}: {:?}", rt.plan);
            assert_eq!(prompt_logits(model.as_ref()), in_memory, "{what}");
            let opts = GenerateOptions {
                max_new_tokens: want.len(),
                sampling: Sampling::Greedy,
                stop_ids: vec![],
                prefill_chunk: 3,
            };
            let mut state = model.new_state();
            let got = generate(model.as_ref(), &mut state, &prompt, &opts, |_| {
                deltafin_engine::generate::Flow::Continue
            })
            .unwrap();
            assert_eq!(got.output_ids, want, "{what}");
        }
    }
}

/// The fixture's tokenizer against HF's (`golden.json["tokenizer"]`, from the fixture's own
/// `tokenizer.json` and `chat_template` through transformers): plain encodes (specials
/// recognised, nothing added: `add_special_tokens=False`), decode round trips, and a rendered
/// multi-turn chat with its ids (`apply_chat_template`), plus the golden prompt's ids.
pub fn check_tokenizer(name: &str) {
    use deltafin_engine::tokenizer::{ChatOptions, Tokenizer};
    let dir = fixture(name);
    let golden: Value = serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let t = Tokenizer::from_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let tok = &golden["tokenizer"];
    let cases = tok["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(t.encode_with_special(text), want, "{name}: encode {text:?}");
        // `decoded` when the tokenizer's normaliser changes the text (NFC), else the text.
        let decoded = case["decoded"].as_str().unwrap_or(text);
        assert_eq!(t.decode(&want), decoded, "{name}: decode {text:?}");
    }
    let chat = &tok["chat"];
    let turns = messages(&chat["messages"]);
    let opts = ChatOptions {
        add_generation_prompt: chat["add_generation_prompt"].as_bool().unwrap(),
        ..ChatOptions::default()
    };
    assert_eq!(
        t.render_chat(&turns, &opts).unwrap(),
        chat["rendered"].as_str().unwrap(),
        "{name}: chat"
    );
    assert_eq!(
        t.encode_chat(&turns, &opts).unwrap(),
        ids(&chat["ids"]),
        "{name}: chat ids"
    );
    let prompt = messages(&golden["prompt_messages"]);
    let opts = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    assert_eq!(
        t.encode_chat(&prompt, &opts).unwrap(),
        ids(&golden["prompt_ids"]),
        "{name}: prompt ids"
    );
}

/// One pass over `tokens` appended to `state`, every row's logits as bits.
pub fn pass_bits(
    m: &dyn arch::Model,
    state: &mut deltafin_engine::state::SeqState,
    tokens: &[u32],
) -> Vec<u32> {
    m.forward(
        &mut [SeqInput {
            state,
            tokens,
            logits: LogitRows::All,
        }],
        None,
    )
    .unwrap()
    .iter()
    .map(|x| x.to_bits())
    .collect()
}

/// The logits' bits of `prompt` prefilled in chunks of `chunk` into a fresh state.
fn chunked_bits(m: &dyn arch::Model, prompt: &[u32], chunk: usize) -> Vec<u32> {
    let mut state = m.new_state();
    prompt
        .chunks(chunk)
        .flat_map(|c| pass_bits(m, &mut state, c))
        .collect()
}

/// The exactness properties every family must have, on fixture `name`'s prompt:
/// * a prefill in one pass, in chunks of 3 and 7, and token by token give bit-identical logits;
/// * three sequences of different lengths batched into one pass give each one's bits alone;
/// * a state truncated back to a shared prefix and continued (prefix reuse) equals a fresh one;
/// * n-gram drafts (forced on every step) never change greedy ids.
pub fn check_consistency(name: &str) {
    use deltafin_engine::generate::generate_with;
    use deltafin_engine::spec::ngram::{Ngram, NgramConfig};
    use deltafin_engine::spec::{EconomicsConfig, Speculator};
    let dir = fixture(name);
    let golden: Value = serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let model = arch::load(&dir).unwrap();
    let m = model.as_ref();
    let prompt = ids(&golden["prompt_ids"]);
    let whole = pass_bits(m, &mut m.new_state(), &prompt);
    for chunk in [1, 3, 7] {
        let got = chunked_bits(m, &prompt, chunk);
        assert_eq!(got, whole, "{name}: prefill in chunks of {chunk}");
    }
    let vocab = m.info().vocab_size;
    let seqs: Vec<Vec<u32>> = vec![
        prompt.clone(),
        prompt[..prompt.len() / 3].to_vec(),
        prompt.iter().rev().map(|&t| (t + 1) % vocab as u32).collect(),
    ];
    let alone: Vec<Vec<u32>> = seqs.iter().map(|s| pass_bits(m, &mut m.new_state(), s)).collect();
    let mut states: Vec<_> = seqs.iter().map(|_| m.new_state()).collect();
    let mut batch: Vec<SeqInput<'_>> = states
        .iter_mut()
        .zip(&seqs)
        .map(|(state, tokens)| SeqInput {
            state,
            tokens,
            logits: LogitRows::All,
        })
        .collect();
    let batched: Vec<u32> = m
        .forward(&mut batch, None)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    assert_eq!(
        batched,
        alone.concat(),
        "{name}: a batched pass differs from each sequence alone"
    );

    // Recurrent layers rewind to a checkpoint, so the reused state takes one at the cut, as the
    // scheduler does at its checkpoint interval.
    let cut = prompt.len() / 2;
    let mut reused = m.new_state();
    pass_bits(m, &mut reused, &prompt[..cut]);
    reused.checkpoint(1);
    pass_bits(m, &mut reused, &prompt[cut..]);
    pass_bits(m, &mut reused, &seqs[2][..5]);
    reused.truncate(cut).unwrap();
    let tail = pass_bits(m, &mut reused, &prompt[cut..]);
    assert_eq!(
        tail,
        whole[cut * vocab..],
        "{name}: a reused prefix differs from a fresh one"
    );

    let opts = GenerateOptions {
        max_new_tokens: 20,
        sampling: Sampling::Greedy,
        stop_ids: vec![],
        prefill_chunk: 4,
    };
    let plain = generate(m, &mut m.new_state(), &prompt, &opts, |_| {
        deltafin_engine::generate::Flow::Continue
    })
    .unwrap()
    .output_ids;
    let econ = EconomicsConfig {
        forced: true,
        max_width: 6,
        ..Default::default()
    };
    let ngram = Ngram::new(NgramConfig {
        min_n: 1,
        ..Default::default()
    });
    let mut spec = Speculator::new(vec![Box::new(ngram)], &econ, None);
    let drafted = generate_with(m, &mut m.new_state(), &prompt, &opts, Some(&mut spec), |_| {
        deltafin_engine::generate::Flow::Continue
    })
    .unwrap()
    .output_ids;
    assert_eq!(drafted, plain, "{name}: n-gram drafts changed the output");
}

/// A golden's `[{role, content}]` messages.
pub fn messages(v: &Value) -> Vec<deltafin_engine::tokenizer::ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            deltafin_engine::tokenizer::ChatMessage::new(
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A `len`-token prompt of ids below `vocab` on fixture `name`: one pass, chunks of 256 and of
/// 64, and the same prompt batched beside another sequence give the same logits bit for bit.
/// Returns the model and the one-pass state (for each family's context-memory checks).
pub fn long_prompt_bits_agree(
    name: &str,
    len: usize,
    vocab: usize,
) -> (Box<dyn arch::Model>, deltafin_engine::state::SeqState) {
    let model = arch::load(&fixture(name)).unwrap();
    let m = model.as_ref();
    let prompt: Vec<u32> = (0..len).map(|i| ((i * 7919 + 13) % vocab) as u32).collect();
    let mut state = m.new_state();
    let whole = pass_bits(m, &mut state, &prompt);
    for chunk in [256, 64] {
        let got = chunked_bits(m, &prompt, chunk);
        assert_eq!(got, whole, "{name}: {len} tokens in chunks of {chunk}");
    }
    let other: Vec<u32> = (0..100).map(|i| ((i * 31 + 5) % vocab) as u32).collect();
    let (mut a, mut b) = (m.new_state(), m.new_state());
    let batch = &mut [
        SeqInput {
            state: &mut a,
            tokens: &other,
            logits: LogitRows::All,
        },
        SeqInput {
            state: &mut b,
            tokens: &prompt,
            logits: LogitRows::All,
        },
    ];
    let batched: Vec<u32> = m
        .forward(batch, None)
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let v = m.info().vocab_size;
    assert_eq!(
        batched[other.len() * v..],
        whole[..],
        "{name}: {len} tokens batched with another sequence"
    );
    (model, state)
}
