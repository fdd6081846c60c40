//! Speculative decoding never changes output: for every proposer — n-gram prompt lookup, the
//! DSpark-style draft head, the Qwen3 cross-tokenizer drafter, the checkpoint's own MTP module
//! where it publishes one (GLM-4.5, GLM-5), and two replay proposers that are
//! always right and always wrong — on the DeepSeek-V3, Kimi-Linear and K3 fixtures, a synthetic
//! DeepSeek-V3 model and the Qwen3 fixture itself, the token ids generated with drafts equal the
//! target-only ids, greedy and seeded sampling, over 50 prompts of varied length. Drafting is
//! forced on (`EconomicsConfig::forced`) so every step drafts; the replay proposers prove that
//! right drafts are accepted (all of them) and wrong ones never are.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deltafin_engine::arch::{self, Model};
use deltafin_engine::generate::{Flow, GenerateOptions, Sampling, generate, generate_with};
use deltafin_engine::spec::dspark::DSpark;
use deltafin_engine::spec::mtp::Mtp;
use deltafin_engine::spec::ngram::{Ngram, NgramConfig};
use deltafin_engine::spec::qwen::{QwenDraftConfig, QwenDrafter};
use deltafin_engine::spec::{EconomicsConfig, Proposal, Proposer, ProposerKind, SpecSummary, Speculator};
use deltafin_engine::synth::{DSparkSynth, DeepseekSynth, ExpertFormat};
use deltafin_engine::tokenizer::Tokenizer;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Replays a known continuation (the target-only output), or a corrupted copy of it.
#[derive(Debug)]
struct Replay {
    prompt_len: usize,
    continuation: Vec<u32>,
    wrong: bool,
    vocab: u32,
}

impl Proposer for Replay {
    fn kind(&self) -> ProposerKind {
        ProposerKind::Custom
    }

    fn propose(
        &mut self,
        _target: &dyn Model,
        history: &[u32],
        max: usize,
    ) -> deltafin_engine::Result<Proposal> {
        let emitted = history.len() - self.prompt_len;
        let next = self.continuation.iter().skip(emitted).take(max);
        Ok(Proposal::new(
            next.map(|&t| if self.wrong { (t + 1) % self.vocab } else { t })
                .collect(),
        ))
    }
}

/// 50 prompts: text encoded with the target's tokenizer (canonical, so the Qwen drafter can
/// translate), repetitive id patterns (n-gram matches) and pseudo-random ids; lengths 1..~60.
fn prompts(tok: &Tokenizer, vocab: usize) -> Vec<Vec<u32>> {
    let texts = [
        "The licenses for most software are designed to take away your freedom to share and change it.",
        "This License applies to any program or other work which contains a notice",
        "Hello, world! Hello, world! Hello, world!",
        "for i in range(10): print(i)\nfor i in range(10): print(i)\n",
        "You may copy and distribute verbatim copies of the Program's source code",
        "a b c d e f g a b c d e f g a b c",
    ];
    let limit = (vocab - 2) as u64;
    (0..50usize)
        .map(|i| {
            let p: Vec<u32> = match i % 3 {
                0 => {
                    let text = texts[i / 3 % texts.len()];
                    let ids = tok.encode(text);
                    let cut = 1 + (i * 5) % ids.len().max(1);
                    ids[..cut.min(ids.len())].to_vec()
                }
                1 => {
                    let period = 2 + i % 4;
                    (0..(4 + i % 37))
                        .map(|j| (3 + (j % period) * 11 + i) as u32 % limit as u32)
                        .collect()
                }
                _ => {
                    let mut x = 0x9E37_79B9_u64.wrapping_mul(i as u64 + 1);
                    (0..(1 + (i * 13) % 61))
                        .map(|_| {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            ((x >> 33) % limit) as u32
                        })
                        .collect()
                }
            };
            if p.is_empty() { vec![2] } else { p }
        })
        .collect()
}

fn run(model: &dyn Model, prompt: &[u32], opts: &GenerateOptions, spec: Option<&mut Speculator>) -> Vec<u32> {
    let mut state = model.new_state();
    generate_with(model, &mut state, prompt, opts, spec, |_| Flow::Continue)
        .unwrap()
        .output_ids
}

fn forced() -> EconomicsConfig {
    EconomicsConfig {
        forced: true,
        max_width: 6,
        ..Default::default()
    }
}

/// Check every proposer against target-only decoding on the model in `dir`; returns the drafting
/// figures per proposer label (replays as `right` / `wrong`).
fn check(dir: &Path, label: &str) -> std::collections::BTreeMap<&'static str, SpecSummary> {
    let model = arch::load(dir).unwrap_or_else(|e| panic!("{label}: {e}"));
    let tok = Arc::new(Tokenizer::from_dir(dir).unwrap());
    let info = model.info().clone();
    let head_dir = tempfile::tempdir().unwrap();
    DSparkSynth::for_target(&info, 11).write(head_dir.path()).unwrap();
    let head = Arc::new(DSpark::load(head_dir.path()).unwrap());
    head.check_target(model.as_ref()).unwrap();
    let qwen =
        Arc::new(QwenDrafter::load(&fixture("qwen3"), tok.clone(), QwenDraftConfig::default()).unwrap());
    let mtp = arch::load_mtp(dir).unwrap().map(|m| Arc::new(Mtp::new(m)));
    if let Some(m) = &mtp {
        m.check_target(model.as_ref()).unwrap();
    }
    let samplings = [Sampling::Greedy, Sampling::new(0.8, 0.95, 0, 7).unwrap()];
    let mut totals: std::collections::BTreeMap<&'static str, SpecSummary> = Default::default();
    for sampling in samplings {
        for (i, prompt) in prompts(&tok, info.vocab_size).iter().enumerate() {
            let stop_ids = if i % 5 == 4 {
                info.eos_token_ids.clone()
            } else {
                Vec::new()
            };
            let opts = GenerateOptions {
                max_new_tokens: 6 + i % 23,
                sampling,
                stop_ids,
                prefill_chunk: 1 + i % 9,
            };
            let want = run(model.as_ref(), prompt, &opts, None);
            let replay = |wrong| Replay {
                prompt_len: prompt.len(),
                continuation: want.clone(),
                wrong,
                vocab: info.vocab_size as u32,
            };
            let mut proposers: Vec<(&'static str, Box<dyn Proposer>)> = vec![
                ("ngram", Box::new(Ngram::default())),
                // Unigram matches too, so a target that never repeats a bigram is still drafted for.
                (
                    "ngram1",
                    Box::new(Ngram::new(NgramConfig {
                        min_n: 1,
                        ..Default::default()
                    })),
                ),
                ("dspark", Box::new(head.session(8192))),
                ("qwen", Box::new(qwen.session())),
                ("right", Box::new(replay(false))),
                ("wrong", Box::new(replay(true))),
            ];
            if let Some(m) = &mtp {
                proposers.push(("mtp", Box::new(m.session())));
            }
            for (name, proposer) in proposers {
                let mut spec = Speculator::new(vec![proposer], &forced(), None);
                let got = run(model.as_ref(), prompt, &opts, Some(&mut spec));
                assert_eq!(
                    got, want,
                    "{label}: {name} drafts changed the output ({sampling:?}, prompt {i}: {prompt:?})"
                );
                totals.entry(name).or_default().merge(spec.summary());
            }
        }
    }
    let stats = |name: &str, kind: ProposerKind| {
        totals[name]
            .proposers
            .get(kind.label())
            .cloned()
            .unwrap_or_default()
    };
    let right = stats("right", ProposerKind::Custom);
    assert!(
        right.proposals > 0 && right.accepted_tokens == right.draft_tokens,
        "{label}: right drafts rejected: {right:?}"
    );
    let wrong = stats("wrong", ProposerKind::Custom);
    assert!(
        wrong.proposals > 0 && wrong.accepted_tokens == 0,
        "{label}: wrong drafts accepted: {wrong:?}"
    );
    // A DSpark head reads hidden rows; DeepSeek-V4's layers give hyper-connection streams, so
    // the head drops itself there (its errors change no output).
    let dspark = stats("dspark", ProposerKind::Dspark);
    if label.starts_with("dsv4") {
        assert!(dspark.proposals == 0 && dspark.errors > 0, "{label}: {dspark:?}");
    } else {
        assert!(dspark.proposals > 0, "{label}: the draft head never drafted");
    }
    if mtp.is_some() {
        let m = stats("mtp", ProposerKind::Mtp);
        assert!(
            m.proposals > 0 && m.errors == 0,
            "{label}: the MTP module did not draft: {m:?}"
        );
    }
    for (name, s) in &totals {
        eprintln!("{label} {name}: {}", s.describe());
    }
    let ngram =
        stats("ngram", ProposerKind::Ngram).proposals + stats("ngram1", ProposerKind::Ngram).proposals;
    assert!(ngram > 0, "{label}: n-gram never drafted");
    totals
}

#[test]
fn deepseek_v3_fixture_drafts_never_change_output() {
    check(&fixture("dsv3-bf16"), "dsv3-bf16");
}

#[test]
fn kimi_linear_fixture_drafts_never_change_output() {
    check(&fixture("kimi-linear"), "kimi-linear");
}

#[test]
fn kimi_k3_fixture_drafts_never_change_output() {
    check(&fixture("k3"), "k3");
}

#[test]
fn qwen3_moe_fixture_drafts_never_change_output() {
    check(&fixture("qwen3-moe"), "qwen3-moe");
}

#[test]
fn glm4_moe_fixture_drafts_never_change_output() {
    check(&fixture("glm4-moe-fp8"), "glm4-moe-fp8");
}

#[test]
fn glm5_fixture_drafts_never_change_output() {
    check(&fixture("glm5-dsa-fp8"), "glm5-dsa-fp8");
}

#[test]
fn deepseek_v32_fixture_drafts_never_change_output() {
    check(&fixture("dsv32-dsa-bf16"), "dsv32-dsa-bf16");
}

#[test]
fn deepseek_v4_fixture_drafts_never_change_output() {
    let s = check(&fixture("dsv4-flash"), "dsv4-flash");
    assert!(s.contains_key("mtp"), "the fixture's MTP block drafted");
}

#[test]
fn gpt_oss_fixture_drafts_never_change_output() {
    check(&fixture("gpt-oss"), "gpt-oss");
}

#[test]
fn minimax_m2_fixture_drafts_never_change_output() {
    check(&fixture("minimax-m2-fp8"), "minimax-m2-fp8");
}

#[test]
fn qwen3_next_fixture_drafts_never_change_output() {
    check(&fixture("qwen3-next"), "qwen3-next");
}

#[test]
fn qwen35_moe_fixtures_drafts_never_change_output() {
    check(&fixture("qwen3.5-moe"), "qwen3.5-moe");
    check(&fixture("qwen3.5-moe-fp8"), "qwen3.5-moe-fp8");
}

#[test]
fn synthetic_deepseek_model_drafts_never_change_output() {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(ExpertFormat::Int4).write(dir.path()).unwrap();
    check(dir.path(), "synthetic-int4");
}

#[test]
fn a_qwen_drafter_equal_to_its_target_drafts_and_is_accepted() {
    // Target and drafter are the same Qwen3 fixture: every translated draft matches greedy
    // decoding, so acceptance proves the translation and the drafter's cache reuse are right.
    let totals = check(&fixture("qwen3"), "qwen3");
    let q = totals["qwen"].proposers.get("qwen").cloned().unwrap_or_default();
    assert!(q.proposals > 0, "the Qwen drafter never offered a draft: {q:?}");
    assert!(q.accepted_tokens > 0, "no Qwen draft was accepted: {q:?}");
}

#[test]
fn auto_economics_keeps_output_identical_and_switches_losing_drafts_off() {
    let dir = fixture("k3");
    let model = arch::load(&dir).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 120,
        sampling: Sampling::Greedy,
        stop_ids: vec![],
        prefill_chunk: 16,
    };
    let prompt: Vec<u32> = (0..20).map(|i| 5 + i * 3).collect();
    let want = run(model.as_ref(), &prompt, &opts, None);
    let wrong = Replay {
        prompt_len: prompt.len(),
        continuation: want.clone(),
        wrong: true,
        vocab: model.info().vocab_size as u32,
    };
    // The gate runs on measured time; a 50 % margin keeps timing noise on a loaded machine from
    // making a proposer that is never right look worth it.
    let cfg = EconomicsConfig {
        min_gain: 0.5,
        ..Default::default()
    };
    let mut spec = Speculator::new(vec![Box::new(wrong)], &cfg, None);
    let got = run(model.as_ref(), &prompt, &opts, Some(&mut spec));
    assert_eq!(got, want);
    let s = spec.summary().proposers["custom"].clone();
    assert!(
        s.switched_off >= 1,
        "always-wrong drafts were never switched off: {s:?}"
    );
    assert!(s.proposals < 20, "always-wrong drafts kept drafting: {s:?}");
    assert!(spec.summary().target_only_steps > 60);
    let plain = generate(model.as_ref(), &mut model.new_state(), &prompt, &opts, |_| {
        Flow::Continue
    })
    .unwrap();
    assert_eq!(plain.output_ids, want);
}
