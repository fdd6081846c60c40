//! Kimi K3 and Kimi-Linear exactness properties on synthetic checkpoints in the real formats
//! (K3: MXFP4 experts, `language_model.` prefix): multi-row prefill equals token-by-token decode
//! bit for bit; batching never changes a sequence's logits; state transactions (a pass committed
//! to a prefix equals running that prefix one token at a time, for KDA and MLA layers); a long
//! (16k-token) context run; and fail-closed config validation.

use std::path::Path;

use deltafin_engine::Error;
use deltafin_engine::arch::ModelSpec;
use deltafin_engine::arch::{self, LogitRows, Model, SeqInput};
use deltafin_engine::config::{KimiK3Config, KimiLinearConfig, Spec};
use deltafin_engine::generate::SeqState;
use deltafin_engine::synth::KimiSynth;
use serde_json::{Value, json};

fn model_of(synth: &KimiSynth) -> (tempfile::TempDir, Box<dyn Model>) {
    let dir = tempfile::tempdir().unwrap();
    synth.write(dir.path()).unwrap();
    let m = arch::load(dir.path()).unwrap();
    (dir, m)
}

fn variants() -> [KimiSynth; 2] {
    [KimiSynth::k3_tiny(), KimiSynth::linear_tiny()]
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 11 + 5) % 500).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn run(m: &dyn Model, s: &mut SeqState, tokens: &[u32], logits: LogitRows) -> Vec<f32> {
    m.forward(
        &mut [SeqInput {
            state: s,
            tokens,
            logits,
        }],
        None,
    )
    .unwrap()
}

#[test]
fn checkpoints_load_as_the_intended_architectures() {
    let (dir, m) = model_of(&KimiSynth::k3_tiny());
    assert_eq!(m.info().arch, "kimi_k3");
    let spec = Spec::<KimiK3Config>::load_typed(dir.path()).unwrap();
    assert_eq!(spec.tensor_prefix, "language_model.");
    assert!(spec.arch.attn_res_block_size == 2 && spec.arch.num_blocks() == 3);
    let (_dir, m) = model_of(&KimiSynth::linear_tiny());
    assert_eq!(m.info().arch, "kimi_linear");
}

/// The built-in K3 preset (`--model builtin:k3`) is a K3-architecture checkpoint with MXFP4
/// experts and a tokenizer carrying K3's special tokens and chat format.
#[test]
fn builtin_k3_preset_is_a_k3_checkpoint() {
    use deltafin_engine::builtin::Builtin;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("builtin");
    assert!(Builtin::K3.ensure(&target).unwrap());
    assert!(!Builtin::K3.ensure(&target).unwrap(), "second call reuses it");
    let spec = Spec::<KimiK3Config>::load_typed(&target).unwrap();
    assert!(matches!(
        spec.quant,
        deltafin_engine::config::Quantization::Mxfp4PackQuantized { group_size: 32, .. }
    ));
    let index = deltafin_engine::weights::WeightIndex::open(&target).unwrap();
    let packed = index
        .info("language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed")
        .unwrap();
    assert_eq!(packed.dtype, deltafin_engine::weights::Dtype::U8);
    let m = arch::load(&target).unwrap();
    assert_eq!(m.info().eos_token_ids, vec![258]);
    let logits = run(m.as_ref(), &mut m.new_state(), &prompt(8, 3), LogitRows::Last);
    assert!(logits.iter().all(|x| x.is_finite()));
    let tok: Value =
        serde_json::from_slice(&std::fs::read(target.join("tokenizer_config.json")).unwrap()).unwrap();
    let added = &tok["added_tokens_decoder"];
    let names: Vec<(&str, &str)> = [
        ("256", "[BOS]"),
        ("257", "[EOS]"),
        ("258", "<|end_of_msg|>"),
        ("259", "<|open|>"),
    ]
    .into_iter()
    .chain([
        ("260", "<|close|>"),
        ("261", "<|sep|>"),
        ("510", "[UNK]"),
        ("511", "[PAD]"),
    ])
    .collect();
    for (id, name) in names {
        assert_eq!(added[id]["content"], name, "{id}");
    }
    assert_eq!(tok["eos_token"], "<|end_of_msg|>");
    assert!(
        tok["chat_template"]
            .as_str()
            .unwrap()
            .contains("<|open|>message role=")
    );
}

/// The built-in tokenizer's chat template renders K3's XTML exactly as the K3 golden fixture
/// records it for a two-turn conversation plus generation prompt (text level; the ids depend on
/// the tokenizer module).
#[test]
fn builtin_chat_template_renders_k3_xtml() {
    let dir = tempfile::tempdir().unwrap();
    deltafin_engine::synth::write_byte_tokenizer_flavor(
        dir.path(),
        deltafin_engine::synth::TokenizerFlavor::K3,
    )
    .unwrap();
    let tok: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("tokenizer_config.json")).unwrap()).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k3/golden.json");
    let golden: Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    let chat = &golden["tokenizer"]["chat"];
    let mut env = minijinja::Environment::new();
    env.add_template("chat", tok["chat_template"].as_str().unwrap())
        .unwrap();
    let rendered = env
        .get_template("chat")
        .unwrap()
        .render(minijinja::context! {
            messages => jinja_value(&chat["messages"]),
            add_generation_prompt => chat["add_generation_prompt"].as_bool().unwrap(),
        })
        .unwrap();
    assert_eq!(rendered, chat["rendered"].as_str().unwrap());
}

fn jinja_value(v: &Value) -> minijinja::Value {
    match v {
        Value::Null => minijinja::Value::from(()),
        Value::Bool(b) => minijinja::Value::from(*b),
        Value::Number(n) => minijinja::Value::from(n.as_f64().unwrap()),
        Value::String(s) => minijinja::Value::from(s.as_str()),
        Value::Array(a) => minijinja::Value::from(a.iter().map(jinja_value).collect::<Vec<_>>()),
        Value::Object(o) => minijinja::Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), jinja_value(v)))),
    }
}

#[test]
fn prefill_equals_token_by_token_decode() {
    for synth in variants() {
        let (_dir, m) = model_of(&synth);
        let v = m.info().vocab_size;
        let tokens = prompt(21, 1);
        let mut s = m.new_state();
        let all = run(m.as_ref(), &mut s, &tokens, LogitRows::All);
        assert_eq!(all.len(), tokens.len() * v);
        assert!(all.iter().all(|x| x.is_finite()));
        let mut s = m.new_state();
        for (i, t) in tokens.iter().enumerate() {
            let one = run(m.as_ref(), &mut s, &[*t], LogitRows::Last);
            assert_eq!(
                bits(&one),
                bits(&all[i * v..(i + 1) * v]),
                "{:?}: position {i}",
                synth.variant
            );
        }
        // Chunked prefill (uneven chunks) equals both.
        let mut s = m.new_state();
        let mut last = Vec::new();
        for chunk in tokens.chunks(5) {
            last = run(m.as_ref(), &mut s, chunk, LogitRows::Last);
        }
        assert_eq!(
            bits(&last),
            bits(&all[(tokens.len() - 1) * v..]),
            "{:?}: chunked",
            synth.variant
        );
    }
}

#[test]
fn batched_sequences_match_running_alone() {
    for synth in variants() {
        let (_dir, m) = model_of(&synth);
        let (a, b, c) = (prompt(9, 2), prompt(4, 3), prompt(13, 4));
        let alone = |t: &[u32]| run(m.as_ref(), &mut m.new_state(), t, LogitRows::All);
        let expect: Vec<f32> = [alone(&a), alone(&b), alone(&c)].concat();
        let (mut sa, mut sb, mut sc) = (m.new_state(), m.new_state(), m.new_state());
        let joint = m
            .forward(
                &mut [
                    SeqInput {
                        state: &mut sa,
                        tokens: &a,
                        logits: LogitRows::All,
                    },
                    SeqInput {
                        state: &mut sb,
                        tokens: &b,
                        logits: LogitRows::All,
                    },
                    SeqInput {
                        state: &mut sc,
                        tokens: &c,
                        logits: LogitRows::All,
                    },
                ],
                None,
            )
            .unwrap();
        assert_eq!(bits(&joint), bits(&expect), "{:?}", synth.variant);
        let mut solo = sa.clone();
        let want = run(m.as_ref(), &mut solo, &[7], LogitRows::Last);
        let step = m
            .forward(
                &mut [
                    SeqInput {
                        state: &mut sb,
                        tokens: &[3, 4],
                        logits: LogitRows::Last,
                    },
                    SeqInput {
                        state: &mut sa,
                        tokens: &[7],
                        logits: LogitRows::Last,
                    },
                ],
                None,
            )
            .unwrap();
        assert_eq!(
            bits(&step[m.info().vocab_size..]),
            bits(&want),
            "{:?}",
            synth.variant
        );
    }
}

/// A pass over `[t, d1..dk]` committed to `t, d1..dm` leaves exactly the state of running those
/// tokens one at a time: the verify rows equal the sequential logits, and after the commit the
/// next steps are bit-identical.
#[test]
fn commit_prefix_equals_sequential_run() {
    for synth in variants() {
        let (_dir, m) = model_of(&synth);
        let v = m.info().vocab_size;
        let mut base = m.new_state();
        run(m.as_ref(), &mut base, &prompt(7, 5), LogitRows::Last);
        let pass: Vec<u32> = vec![11, 203, 57, 301, 9]; // t, d1..d4
        let k = pass.len() - 1;
        for drafts in 0..=k {
            let mut staged = base.clone();
            let rows = run(m.as_ref(), &mut staged, &pass, LogitRows::All);
            assert_eq!(staged.staged_rows(), k + 1);
            staged.commit(drafts + 1).unwrap();
            assert_eq!((staged.len(), staged.staged_rows()), (base.len() + drafts + 1, 0));
            let mut seq = base.clone();
            for (i, &t) in pass[..=drafts].iter().enumerate() {
                let one = run(m.as_ref(), &mut seq, &[t], LogitRows::Last);
                assert_eq!(
                    bits(&one),
                    bits(&rows[i * v..(i + 1) * v]),
                    "{:?}: verify row {i}",
                    synth.variant
                );
            }
            for (step, &x) in [42u32, 7, 300].iter().enumerate() {
                let a = run(m.as_ref(), &mut staged, &[x], LogitRows::Last);
                let b = run(m.as_ref(), &mut seq, &[x], LogitRows::Last);
                assert_eq!(
                    bits(&a),
                    bits(&b),
                    "{:?}: m = {drafts}, step {step} after commit",
                    synth.variant
                );
            }
        }
        // Keeping nothing (and rollback) is the state before the pass.
        let mut staged = base.clone();
        run(m.as_ref(), &mut staged, &pass, LogitRows::None);
        staged.rollback();
        let mut plain = base.clone();
        assert_eq!(staged.len(), plain.len());
        let a = run(m.as_ref(), &mut staged, &[42, 43], LogitRows::All);
        let b = run(m.as_ref(), &mut plain, &[42, 43], LogitRows::All);
        assert_eq!(bits(&a), bits(&b), "{:?}: rollback", synth.variant);
        let err = staged.commit(3).unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { field: "commit", .. }),
            "{err}"
        );
    }
}

/// Greedy speculative decoding with drafts that are partly wrong (commit the accepted prefix)
/// produces exactly the tokens of plain one-token decoding.
#[test]
fn speculative_commits_reproduce_plain_greedy_decoding() {
    let (_dir, m) = model_of(&KimiSynth::k3_tiny());
    let v = m.info().vocab_size;
    let argmax = |l: &[f32]| deltafin_engine::kernels::ops::argmax(l) as u32;
    let p = prompt(6, 9);
    let mut plain_state = m.new_state();
    let mut plain = vec![argmax(&run(m.as_ref(), &mut plain_state, &p, LogitRows::Last))];
    while plain.len() < 24 {
        let next = argmax(&run(
            m.as_ref(),
            &mut plain_state,
            &[*plain.last().unwrap()],
            LogitRows::Last,
        ));
        plain.push(next);
    }
    let mut s = m.new_state();
    let mut out = vec![argmax(&run(m.as_ref(), &mut s, &p, LogitRows::Last))];
    let mut step = 0usize;
    while out.len() < 24 {
        // Drafts: the true continuation with a wrong token planted at a varying depth.
        let pending = *out.last().unwrap();
        let depth = step % 4;
        let truth = &plain[out.len()..plain.len().min(out.len() + 3)];
        let drafts: Vec<u32> = truth
            .iter()
            .enumerate()
            .map(|(i, &t)| if i == depth { (t + 1) % 500 } else { t })
            .collect();
        let tokens: Vec<u32> = std::iter::once(pending).chain(drafts.iter().copied()).collect();
        let logits = run(m.as_ref(), &mut s, &tokens, LogitRows::All);
        let preds: Vec<u32> = logits.chunks(v).map(argmax).collect();
        let accepted = drafts.iter().zip(&preds).take_while(|(d, p)| d == p).count();
        out.extend_from_slice(&drafts[..accepted]);
        out.push(preds[accepted]);
        s.commit(accepted + 1).unwrap();
        step += 1;
    }
    out.truncate(24);
    assert_eq!(out, plain);
}

#[test]
fn truncate_rewinds_only_what_it_can() {
    let (_dir, m) = model_of(&KimiSynth::k3_tiny());
    let mut s = m.new_state();
    run(m.as_ref(), &mut s, &prompt(5, 1), LogitRows::None);
    run(m.as_ref(), &mut s, &[1, 2, 3], LogitRows::None);
    assert_eq!((s.committed_len(), s.len()), (5, 8));
    s.truncate(6).unwrap();
    assert_eq!((s.committed_len(), s.len()), (6, 6));
    let err = s.truncate(4).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                field: "truncate",
                ..
            }
        ),
        "{err}"
    );
    // A state from another model is refused, not misused.
    let (_dir2, other) = model_of(&KimiSynth::linear_tiny());
    let mut foreign = other.new_state();
    let err = m.forward(
        &mut [SeqInput {
            state: &mut foreign,
            tokens: &[1],
            logits: LogitRows::Last,
        }],
        None,
    );
    assert!(matches!(err, Err(Error::InvalidArgument { field: "state", .. })));
}

/// A state rewound to a recurrent-state checkpoint continues exactly as a fresh state fed only
/// that prefix: the KDA layers are restored from the checkpoint, the MLA caches cut. Positions
/// between checkpoints cannot be rewound to, and the thinning bound holds.
#[test]
fn a_checkpointed_state_rewinds_to_any_checkpoint_bit_identically() {
    for synth in variants() {
        let (_dir, m) = model_of(&synth);
        let shared = prompt(300, 4);
        let mut s = m.new_state();
        for chunk in shared.chunks(64) {
            run(m.as_ref(), &mut s, chunk, LogitRows::None);
            s.checkpoint(3);
        }
        // 5 chunk ends (64..300); the newest is kept, the rest thinned to spread out.
        let marks = s.checkpoint_positions();
        assert_eq!(marks.len(), 3, "{marks:?}");
        // The config's state size is what a state really holds: whole cache blocks (300
        // positions in five blocks of 64), the recurrent state and its pre-pass copy.
        let size = m.info().state;
        assert_eq!(2 * size.per_sequence as usize, s.kda_state_bytes());
        assert_eq!(size.per_token as usize * 320, s.mla_cache_bytes());
        assert_eq!(size.per_sequence as usize * marks.len(), s.checkpoint_bytes());
        assert_eq!(size.bytes(300, marks.len()), s.cache_bytes() as u64);
        assert_eq!(*marks.last().unwrap(), 300);
        assert!(s.checkpoint_bytes() > 0);
        let mark = marks[1];
        assert_eq!(s.rewind_point(mark + 10), mark);
        assert!(!s.can_truncate(mark + 10));
        let suffix = prompt(9, 8);
        let mut rewound = s.clone();
        rewound.truncate(mark).unwrap();
        assert_eq!(rewound.len(), mark);
        assert_eq!(rewound.checkpoint_positions(), &marks[..2]);
        let got = run(m.as_ref(), &mut rewound, &suffix, LogitRows::All);
        let mut fresh = m.new_state();
        run(m.as_ref(), &mut fresh, &shared[..mark], LogitRows::None);
        let want = run(m.as_ref(), &mut fresh, &suffix, LogitRows::All);
        assert_eq!(bits(&got), bits(&want), "{:?}", synth.variant);
        // The original state is untouched by its clone's rewind and still continues.
        let err = s.truncate(mark + 10).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    field: "truncate",
                    ..
                }
            ),
            "{err}"
        );
        s.truncate(marks[0]).unwrap();
        assert_eq!(s.len(), marks[0]);
    }
}

/// Paged context memory: a clone (what the reuse cache and a reused prefix hold) shares every
/// cache block and recurrent matrix instead of copying them; each copy then continues on its own
/// (copy on write) with exactly the bits of a fresh run, and the full blocks stay shared.
#[test]
fn a_cloned_state_shares_its_memory_and_each_copy_continues_bit_identically() {
    // Bytes of `of`'s allocations that `other` holds too (`shared`) or does not.
    let bytes_of = |of: &SeqState, other: &SeqState, shared: bool| {
        let mut theirs = std::collections::HashSet::new();
        other.for_each_allocation(&mut |id, _| {
            theirs.insert(id);
        });
        let mut mine = std::collections::HashMap::new();
        of.for_each_allocation(&mut |id, bytes| {
            mine.insert(id, bytes);
        });
        mine.iter()
            .filter(|(id, _)| theirs.contains(*id) == shared)
            .map(|(_, b)| b)
            .sum::<usize>()
    };
    for synth in variants() {
        let (_dir, m) = model_of(&synth);
        let shared = prompt(150, 6);
        let mut a = m.new_state();
        run(m.as_ref(), &mut a, &shared, LogitRows::None);
        a.checkpoint(2);
        let mut b = a.clone();
        // All the clone copied is the small convolution history of each recurrent layer.
        let copied = bytes_of(&b, &a, false);
        let per_sequence = m.info().state.per_sequence as usize;
        assert!(
            copied < per_sequence.max(1),
            "{:?}: {copied} bytes copied",
            synth.variant
        );
        assert_eq!(
            b.kda_state_bytes(),
            per_sequence,
            "a clone leaves the spare behind"
        );
        let common = bytes_of(&b, &a, true);
        // (A checkpoint taken at the state's position holds its live matrix: counted once here.)
        assert!(
            common >= b.mla_cache_bytes() + b.checkpoint_bytes(),
            "{:?}",
            synth.variant
        );
        let (tail_a, tail_b) = (prompt(20, 7), prompt(20, 9));
        let got_a = run(m.as_ref(), &mut a, &tail_a, LogitRows::All);
        let got_b = run(m.as_ref(), &mut b, &tail_b, LogitRows::All);
        for (tail, got) in [(&tail_a, &got_a), (&tail_b, &got_b)] {
            let mut fresh = m.new_state();
            run(m.as_ref(), &mut fresh, &shared, LogitRows::None);
            let want = run(m.as_ref(), &mut fresh, tail, LogitRows::All);
            assert_eq!(bits(got), bits(&want), "{:?}", synth.variant);
        }
        // Positions 0..128 (two full blocks per cache) are still one copy; the third block was
        // written by both and is now two.
        let still = bytes_of(&a, &b, true);
        assert_eq!(
            still,
            m.info().state.per_token as usize * 128 + a.checkpoint_bytes(),
            "{:?}",
            synth.variant
        );
    }
}

/// A 16k-token context on a tiny K3-architecture model completes; the MLA cache holds the
/// compressed latent (kv_lora + rope floats per position and layer). About 30 s under the test
/// profile (opt-level 1) on one core.
#[test]
fn sixteen_k_token_context() {
    let synth = KimiSynth::k3_tiny();
    let (_dir, m) = model_of(&synth);
    let tokens: Vec<u32> = (0..16_384u32).map(|i| (i * 7919 + 13) % 500).collect();
    let mut s = m.new_state();
    let mut logits = Vec::new();
    let start = std::time::Instant::now();
    for (i, chunk) in tokens.chunks(1024).enumerate() {
        let rows = if (i + 1) * 1024 >= tokens.len() {
            LogitRows::Last
        } else {
            LogitRows::None
        };
        logits = run(m.as_ref(), &mut s, chunk, rows);
    }
    for _ in 0..4 {
        let next = deltafin_engine::kernels::ops::argmax(&logits) as u32;
        logits = run(m.as_ref(), &mut s, &[next], LogitRows::Last);
    }
    assert_eq!(s.len(), 16_384 + 4);
    assert!(logits.iter().all(|x| x.is_finite()));
    let per_token_layer = s.mla_cache_bytes() / (s.len() * s.mla_layers());
    assert_eq!(per_token_layer, 4 * (synth.kv_lora + synth.rope));
    eprintln!(
        "16k context: {} tokens in {:.1?}; MLA cache {} B/token/layer (f32 latent {} + shared key {}); \
         KDA state {} B total (constant); real K3 shapes: {} B/token/layer",
        s.len(),
        start.elapsed(),
        per_token_layer,
        synth.kv_lora,
        synth.rope,
        s.kda_state_bytes(),
        4 * (512 + 64)
    );
}

/// 16k-token prompts: the last position's logits are bit-identical whether the prompt is prefilled in
/// chunks of 64, 256 or 4096 tokens or in one pass (the tiled attention merges its key blocks in
/// a fixed order whatever the chunking and the thread count), on K3 and Kimi-Linear.
#[test]
fn long_prompt_logits_do_not_depend_on_the_chunk_size() {
    let len = 16_384; // sixteen attention blocks (1,024 positions) at every chunking
    // One attention head: the block merge order under test is per head (and the cost of the
    // test is its MLA layers over sixteen thousand positions, four times).
    for synth in variants().map(|s| KimiSynth { heads: 1, ..s }) {
        let (_dir, m) = model_of(&synth);
        let tokens: Vec<u32> = (0..len as u32).map(|i| (i * 7919 + 13) % 500).collect();
        let logits_with = |chunk: usize| {
            let mut s = m.new_state();
            let mut out = Vec::new();
            for (i, part) in tokens.chunks(chunk).enumerate() {
                let last = (i + 1) * chunk >= tokens.len();
                let rows = if last { LogitRows::Last } else { LogitRows::None };
                out = run(m.as_ref(), &mut s, part, rows);
            }
            bits(&out)
        };
        let whole = logits_with(len);
        for chunk in [64, 256, 4096] {
            assert_eq!(logits_with(chunk), whole, "chunk {chunk}");
        }
    }
}

// ---- fail-closed configs -------------------------------------------------------------------

fn k3_config() -> Value {
    KimiSynth::k3_tiny().config()
}

fn parse(v: &Value) -> deltafin_engine::Result<ModelSpec> {
    ModelSpec::from_value(v, Path::new("config.json"))
}

fn field_err(v: &Value) -> String {
    match parse(v) {
        Err(Error::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn layer_lists_must_partition_the_layers() {
    let cases = [
        (json!([1, 2, 4, 5]), json!([3, 6, 6])), // duplicate
        (json!([1, 2, 4]), json!([3, 6])),       // layer 5 missing
        (json!([1, 2, 3, 4, 5]), json!([3, 6])), // in both
        (json!([0, 1, 2, 4, 5]), json!([3, 6])), // zero-based entry
        (json!([1, 2, 4, 5]), json!([3, 6, 7])), // out of range
        (json!("1,2,4,5"), json!([3, 6])),       // not a list
    ];
    for (kda, full) in cases {
        let mut v = k3_config();
        v["text_config"]["linear_attn_config"]["kda_layers"] = kda.clone();
        v["text_config"]["linear_attn_config"]["full_attn_layers"] = full.clone();
        let field = field_err(&v);
        assert!(
            field.starts_with("text_config.linear_attn_config."),
            "{kda} {full}: {field}"
        );
    }
    let mut v = k3_config();
    v["text_config"]["linear_attn_config"]
        .as_object_mut()
        .unwrap()
        .remove("kda_layers");
    assert_eq!(field_err(&v), "text_config.linear_attn_config.kda_layers");
}

#[test]
fn unknown_or_inconsistent_fields_are_refused() {
    let mut v = k3_config();
    v["text_config"]["attn_res_variant"] = json!("full");
    assert_eq!(field_err(&v), "text_config.attn_res_variant");
    let mut v = k3_config();
    v["text_config"]["linear_attn_config"]["use_short_conv"] = json!(false);
    assert_eq!(field_err(&v), "text_config.linear_attn_config.use_short_conv");
    let mut v = k3_config();
    v["rope_scaling"] = json!({"type": "yarn"});
    assert_eq!(field_err(&v), "rope_scaling");
    let edits: [(&str, Value, &str); 10] = [
        ("hidden_act", json!("silu"), "text_config.hidden_act"),
        ("mla_use_nope", json!(false), "text_config.mla_use_nope"),
        ("attn_res_block_size", json!(0), "text_config.attn_res_block_size"),
        (
            "activation_situ_beta",
            json!(-1.0),
            "text_config.activation_situ_beta",
        ),
        (
            "moe_router_activation_func",
            json!("softmax"),
            "text_config.moe_router_activation_func",
        ),
        (
            "num_experts_per_token",
            json!(99),
            "text_config.num_experts_per_token",
        ),
        ("num_experts_per_tok", json!(2), "text_config.num_experts_per_tok"),
        ("moe_layer_freq", json!(2), "text_config.moe_layer_freq"),
        (
            "layer_types",
            json!(["full_attention"]),
            "text_config.layer_types",
        ),
        (
            "latent_moe_use_norm",
            Value::Null,
            "text_config.latent_moe_use_norm",
        ),
    ];
    for (field, value, want) in edits {
        let mut v = k3_config();
        v["text_config"][field] = value;
        assert_eq!(field_err(&v), want, "{field}");
    }
    let mut v = k3_config();
    v["text_config"]["quantization_config"]["kv_cache_scheme"] = json!({"num_bits": 8});
    assert!(field_err(&v).ends_with("quantization_config.kv_cache_scheme"));
    let mut v = k3_config();
    v["eos_token_id"] = json!(257);
    assert_eq!(field_err(&v), "eos_token_id");
    let mut v = k3_config();
    v["text_config"]["linear_attn_config"]["gate_lower_bound"] = json!(1.0);
    assert_eq!(field_err(&v), "text_config.linear_attn_config.gate_lower_bound");
    let mut v = k3_config();
    v["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["scale_dtype"] =
        json!("torch.float32");
    assert!(field_err(&v).ends_with("scale_dtype"));
    // K3-only fields in a Kimi-Linear config are not understood there.
    let mut v = KimiSynth::linear_tiny().config();
    v["attn_res_block_size"] = json!(4);
    assert_eq!(field_err(&v), "attn_res_block_size");
    let mut v = KimiSynth::linear_tiny().config();
    v["linear_attn_config"]["gate_lower_bound"] = json!(-5.0);
    assert_eq!(field_err(&v), "linear_attn_config.gate_lower_bound");
}

#[test]
fn hf_spellings_and_derived_fields_are_understood() {
    let mut v = KimiSynth::linear_tiny().config();
    let o = v.as_object_mut().unwrap();
    for (kimi, hf) in [
        ("num_experts", "num_local_experts"),
        ("moe_renormalize", "norm_topk_prob"),
        ("model_max_length", "max_position_embeddings"),
    ] {
        let value = o.remove(kimi).unwrap();
        o.insert(hf.into(), value);
    }
    o.remove("first_k_dense_replace");
    o.insert(
        "mlp_layer_types".into(),
        json!(["dense", "sparse", "sparse", "sparse"]),
    );
    o.insert(
        "layer_types".into(),
        json!([
            "linear_attention",
            "full_attention",
            "linear_attention",
            "full_attention"
        ]),
    );
    o.insert("linear_head_dim".into(), json!(16));
    o.insert("head_dim".into(), json!(8));
    let c = Spec::<KimiLinearConfig>::from_value_typed(&v, Path::new("config.json"))
        .unwrap()
        .arch;
    assert_eq!(
        (c.num_experts, c.moe_layers[0], c.moe_layers[1]),
        (8, false, true)
    );
    v["linear_head_dim"] = json!(32);
    assert_eq!(field_err(&v), "linear_head_dim");
}

#[test]
fn a_log_that_does_not_broadcast_is_a_shape_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut synth = KimiSynth::k3_tiny();
    synth.kda_head_dim = 32; // A_log [32] is fine per channel ...
    synth.write(dir.path()).unwrap();
    assert!(arch::load(dir.path()).is_ok());
    // ... but a config that disagrees with the stored [32] cannot broadcast it.
    let path = dir.path().join("config.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["text_config"]["linear_attn_config"]["head_dim"] = json!(16);
    v["text_config"]["linear_attn_config"]["num_heads"] = json!(4);
    std::fs::write(&path, v.to_string()).unwrap();
    let err = arch::load(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("A_log") || err.to_string().contains("conv1d"),
        "{err}"
    );
}

/// K3's chat format end to end at the id level: the K3 fixture's tokenizer (tiktoken ranks and
/// K3 specials) with the built-in XTML chat template encodes the fixture's two-turn conversation
/// (a user text containing `<|open|>` included) to exactly the oracle's ids: special tokens come
/// only from the renderer, user text is never turned into special tokens.
#[test]
fn k3_chat_ids_match_the_fixture() {
    use deltafin_engine::tokenizer::{ChatMessage, ChatOptions, Tokenizer};
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k3");
    let golden: Value = serde_json::from_slice(&std::fs::read(fixture.join("golden.json")).unwrap()).unwrap();
    let chat = &golden["tokenizer"]["chat"];
    let dir = tempfile::tempdir().unwrap();
    deltafin_engine::synth::write_byte_tokenizer_flavor(
        dir.path(),
        deltafin_engine::synth::TokenizerFlavor::K3,
    )
    .unwrap();
    let builtin: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("tokenizer_config.json")).unwrap()).unwrap();
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(fixture.join("tokenizer_config.json")).unwrap()).unwrap();
    config["chat_template"] = builtin["chat_template"].clone();
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    std::fs::copy(fixture.join("tiktoken.model"), dir.path().join("tiktoken.model")).unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let messages: Vec<ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let opts = ChatOptions {
        add_generation_prompt: chat["add_generation_prompt"].as_bool().unwrap(),
        ..Default::default()
    };
    assert_eq!(
        tok.render_chat(&messages, &opts).unwrap(),
        chat["rendered"].as_str().unwrap()
    );
    let want: Vec<u32> = chat["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(tok.encode_chat(&messages, &opts).unwrap(), want);
}
