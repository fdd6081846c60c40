//! Exactness properties on synthetic checkpoints in every stored format: multi-row prefill and
//! token-by-token decode give bit-identical logits at every position; a sequence's logits do not
//! depend on which other sequences share its pass; chunked prefill equals one-shot prefill.

use deltafin_engine::arch::{self, LogitRows, Model, SeqInput};
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};

fn model(format: ExpertFormat) -> (tempfile::TempDir, Box<dyn Model>) {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(format).write(dir.path()).unwrap();
    let m = arch::load(dir.path()).unwrap();
    (dir, m)
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 37 + salt * 11 + 5) % 500).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const FORMATS: [ExpertFormat; 3] = [ExpertFormat::Bf16, ExpertFormat::Fp8, ExpertFormat::Int4];

#[test]
fn prefill_equals_token_by_token_decode() {
    for format in FORMATS {
        let (_dir, m) = model(format);
        let v = m.info().vocab_size;
        let tokens = prompt(19, 1);
        let mut s = m.new_state();
        let all = m
            .forward(
                &mut [SeqInput {
                    state: &mut s,
                    tokens: &tokens,
                    logits: LogitRows::All,
                }],
                None,
            )
            .unwrap();
        assert_eq!(all.len(), tokens.len() * v);
        let mut s = m.new_state();
        for (i, t) in tokens.iter().enumerate() {
            let one = m
                .forward(
                    &mut [SeqInput {
                        state: &mut s,
                        tokens: &[*t],
                        logits: LogitRows::Last,
                    }],
                    None,
                )
                .unwrap();
            assert_eq!(
                bits(&one),
                bits(&all[i * v..(i + 1) * v]),
                "{format:?}: position {i}"
            );
        }
        assert!(all.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn batched_sequences_match_running_alone() {
    for format in FORMATS {
        let (_dir, m) = model(format);
        let (a, b, c) = (prompt(9, 2), prompt(4, 3), prompt(13, 4));
        let alone = |t: &[u32]| {
            let mut s = m.new_state();
            m.forward(
                &mut [SeqInput {
                    state: &mut s,
                    tokens: t,
                    logits: LogitRows::All,
                }],
                None,
            )
            .unwrap()
        };
        let (ra, rb, rc) = (alone(&a), alone(&b), alone(&c));
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
        let expect: Vec<f32> = ra.iter().chain(&rb).chain(&rc).copied().collect();
        assert_eq!(bits(&joint), bits(&expect), "{format:?}");
        // And a decode step batched with others equals the solo decode step.
        let next = |s: &mut deltafin_engine::generate::SeqState, t: u32| {
            m.forward(
                &mut [SeqInput {
                    state: s,
                    tokens: &[t],
                    logits: LogitRows::Last,
                }],
                None,
            )
            .unwrap()
        };
        let mut solo = sa.clone();
        let want = next(&mut solo, 7);
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
        assert_eq!(bits(&step[m.info().vocab_size..]), bits(&want), "{format:?}");
    }
}

#[test]
fn chunked_prefill_equals_one_pass() {
    let (_dir, m) = model(ExpertFormat::Bf16);
    let tokens = prompt(23, 5);
    let mut s = m.new_state();
    let one = m
        .forward(
            &mut [SeqInput {
                state: &mut s,
                tokens: &tokens,
                logits: LogitRows::Last,
            }],
            None,
        )
        .unwrap();
    let mut s = m.new_state();
    let mut last = Vec::new();
    for chunk in tokens.chunks(6) {
        last = m
            .forward(
                &mut [SeqInput {
                    state: &mut s,
                    tokens: chunk,
                    logits: LogitRows::Last,
                }],
                None,
            )
            .unwrap();
    }
    assert_eq!(bits(&one), bits(&last));
}

/// A 16k-token prompt (sixteen 1,024-position attention blocks): chunks of 64, 256 and 4096
/// tokens and one pass give bit-identical last-position logits.
#[test]
fn long_prompt_logits_do_not_depend_on_the_chunk_size() {
    let dir = tempfile::tempdir().unwrap();
    // One head and one MoE layer: the merge order under test is per head and per layer, and
    // sixteen thousand positions of attention four times is the test's whole cost.
    let synth = DeepseekSynth {
        max_position: 16_384,
        heads: 1,
        layers: 2,
        ..DeepseekSynth::tiny(ExpertFormat::Bf16)
    };
    synth.write(dir.path()).unwrap();
    let m = arch::load(dir.path()).unwrap();
    let tokens = prompt(16_384, 3);
    let logits_with = |chunk: usize| {
        let mut s = m.new_state();
        let mut out = Vec::new();
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let last = (i + 1) * chunk >= tokens.len();
            let logits = if last { LogitRows::Last } else { LogitRows::None };
            out = m
                .forward(
                    &mut [SeqInput {
                        state: &mut s,
                        tokens: part,
                        logits,
                    }],
                    None,
                )
                .unwrap();
        }
        bits(&out)
    };
    let whole = logits_with(tokens.len());
    for chunk in [64, 256, 4096] {
        assert_eq!(logits_with(chunk), whole, "chunk {chunk}");
    }
}

#[test]
fn rollback_restores_the_exact_state() {
    let (_dir, m) = model(ExpertFormat::Int4);
    let tokens = prompt(10, 6);
    let mut s = m.new_state();
    m.forward(
        &mut [SeqInput {
            state: &mut s,
            tokens: &tokens[..6],
            logits: LogitRows::None,
        }],
        None,
    )
    .unwrap();
    let mut branch = s.clone();
    m.forward(
        &mut [SeqInput {
            state: &mut s,
            tokens: &[1, 2, 3],
            logits: LogitRows::None,
        }],
        None,
    )
    .unwrap();
    s.truncate(6).unwrap();
    let a = m
        .forward(
            &mut [SeqInput {
                state: &mut s,
                tokens: &tokens[6..],
                logits: LogitRows::All,
            }],
            None,
        )
        .unwrap();
    let b = m
        .forward(
            &mut [SeqInput {
                state: &mut branch,
                tokens: &tokens[6..],
                logits: LogitRows::All,
            }],
            None,
        )
        .unwrap();
    assert_eq!(bits(&a), bits(&b));
}
