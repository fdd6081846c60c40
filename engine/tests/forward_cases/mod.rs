//! The whole-pass device checks shared by the emulator (`cuda_emulated_forward.rs`) and the GPU
//! (`cuda.rs`): DeepSeek-V3, Kimi-Linear and Kimi K3 sessions on the device against the CPU
//! models, logits bit for bit.

#![allow(dead_code)]

pub mod served;

use std::path::Path;

use deltafin_engine::arch::{LogitRows, Model, SeqInput, device_sequence};
use deltafin_engine::backend::device::DeviceOps;
use deltafin_engine::cache::OocOptions;
use deltafin_engine::config::{DeepseekV3Config, KimiK3Config, KimiLinearConfig, Spec, TextConfig};
use deltafin_engine::generate::{
    FinishReason, Flow, GenerateOptions, Sampling, generate, generate_on_device,
};
use deltafin_engine::model::Loader;
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_engine::weights::WeightIndex;

/// The typed config and weights of the checkpoint in `dir`.
fn open<C: TextConfig>(dir: &Path) -> (Spec<C>, WeightIndex) {
    (Spec::load_typed(dir).unwrap(), WeightIndex::open(dir).unwrap())
}

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// `prompt` and then greedy single-token steps, `passes` in all, through the CPU model and
/// through `device` (a session's forward): the last row's logits must be the same bits.
fn compare(
    model: &dyn Model,
    prompt: &[u32],
    passes: usize,
    what: &str,
    mut device: impl FnMut(&[u32]) -> Vec<f32>,
) {
    let mut state = model.new_state();
    let mut step = prompt.to_vec();
    for pass in 0..passes {
        let input = SeqInput {
            state: &mut state,
            tokens: &step,
            logits: LogitRows::Last,
        };
        let want = model.forward(&mut [input], None).unwrap();
        let got = device(&step);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        assert_eq!(
            bits(&got),
            bits(&want),
            "{what} pass {pass}: device logits differ from the CPU"
        );
        step = vec![deltafin_engine::kernels::ops::argmax(&want) as u32];
    }
}

/// DeepSeek-V3 with FP8 and with INT4 experts (synthetic): a 6-token prefill and two decode
/// steps.
pub fn device_pass_matches_the_cpu<D: DeviceOps>(dev: &D) {
    for format in [ExpertFormat::Fp8, ExpertFormat::Int4] {
        let dir = tempfile::tempdir().unwrap();
        DeepseekSynth::tiny(format).write(dir.path()).unwrap();
        let (spec, index) = open::<DeepseekV3Config>(dir.path());
        let cfg = spec.arch.clone();
        let model = deltafin_engine::arch::deepseek_v3::load(&cfg, &Loader::new(&index, &spec)).unwrap();
        let prompt: Vec<u32> = (0..6).map(|i| (i * 37 + 5) % 200).collect();
        let mut session = model.device_session(dev, 16).unwrap();
        compare(&model, &prompt, 3, &format!("{format:?}"), |t| {
            session.forward(t).unwrap()
        });
        assert_eq!(session.len(), prompt.len() + 2);
    }
}

/// The HF-generated Kimi-Linear fixture (KDA and NoPE-MLA layers, a dense first FFN, MoE with
/// 3 of 8 experts and a shared expert): a 7-token prefill and two decode steps.
pub fn kimi_linear_pass_matches_the_cpu<D: DeviceOps>(dev: &D) {
    let (spec, index) = open::<KimiLinearConfig>(&fixture("kimi-linear"));
    let cfg = spec.arch.clone();
    let model = deltafin_engine::arch::kimi_linear::load(&cfg, &Loader::new(&index, &spec)).unwrap();
    let prompt: Vec<u32> = (0..7).map(|i| (i * 53 + 11) % 300).collect();
    let mut session = model.device_session(dev, 16).unwrap();
    compare(&model, &prompt, 3, "kimi-linear", |t| session.forward(t).unwrap());
    assert_eq!(session.len(), prompt.len() + 2);
}

/// The HF-generated K3 fixture (Block Attention Residuals, KDA and gated MLA, latent MoE with
/// a normalised expert sum, SiTU, router-order combine): a 5-token prefill and one decode step
/// (fewer than the others: the emulator is slow on this fixture).
pub fn k3_pass_matches_the_cpu<D: DeviceOps>(dev: &D) {
    let (spec, index) = open::<KimiK3Config>(&fixture("k3"));
    let cfg = spec.arch.clone();
    let model = deltafin_engine::arch::kimi_k3::load(&cfg, &Loader::new(&index, &spec)).unwrap();
    let prompt: Vec<u32> = (0..5).map(|i| (i * 41 + 3) % 300).collect();
    let mut session = model.device_session(dev, 16).unwrap();
    compare(&model, &prompt, 2, "k3", |t| session.forward(t).unwrap());
    assert_eq!(session.len(), prompt.len() + 1);
}

/// `generate` on the CPU and `generate_on_device` over `arch::device_sequence` from the same
/// prompt and options: the same tokens and finish reason.
fn generation_agrees(
    model: &dyn Model,
    dev: &impl DeviceOps,
    prompt: &[u32],
    opts: &GenerateOptions,
    what: &str,
) {
    let mut state = model.new_state();
    let want = generate(model, &mut state, prompt, opts, |_| Flow::Continue).unwrap();
    let capacity = prompt.len() + opts.max_new_tokens;
    let mut seq = device_sequence(model, dev, capacity).unwrap();
    let mut streamed = Vec::new();
    let got = generate_on_device(seq.as_mut(), model.info().max_context, prompt, opts, |t| {
        streamed.push(t);
        Flow::Continue
    })
    .unwrap();
    assert_eq!(
        got.output_ids, want.output_ids,
        "{what}: device tokens differ from the CPU"
    );
    assert_eq!(got.finish_reason, want.finish_reason, "{what}");
    assert_eq!(got.stats.prompt_tokens, prompt.len());
    let stopped = got.finish_reason == FinishReason::Stop;
    assert_eq!(
        streamed[..],
        got.output_ids[..got.output_ids.len() - usize::from(stopped)]
    );
}

/// Generation on the device: DeepSeek-V3 (FP8 experts) greedy with a chunked prefill, sampled
/// (temperature, top-p, seed), and stopping at a stop id; Kimi-Linear greedy; the
/// architectures without a device pass are refused with a typed error.
pub fn generation_on_the_device_matches_the_cpu<D: DeviceOps>(dev: &D) {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(ExpertFormat::Fp8).write(dir.path()).unwrap();
    let (spec, index) = open::<DeepseekV3Config>(dir.path());
    let cfg = spec.arch.clone();
    let model = deltafin_engine::arch::deepseek_v3::load(&cfg, &Loader::new(&index, &spec)).unwrap();
    let prompt: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % 200).collect();
    let greedy = GenerateOptions {
        max_new_tokens: 5,
        prefill_chunk: 3,
        ..Default::default()
    };
    generation_agrees(&model, dev, &prompt, &greedy, "deepseek greedy");
    let sampled = GenerateOptions {
        sampling: Sampling::new(0.9, 0.95, 0, 7).unwrap(),
        ..greedy.clone()
    };
    generation_agrees(&model, dev, &prompt, &sampled, "deepseek sampled");
    let mut state = model.new_state();
    let free = generate(&model, &mut state, &prompt, &greedy, |_| Flow::Continue).unwrap();
    let stop = GenerateOptions {
        stop_ids: vec![free.output_ids[2]],
        ..greedy.clone()
    };
    generation_agrees(&model, dev, &prompt, &stop, "deepseek stop id");

    let (spec, index) = open::<KimiLinearConfig>(&fixture("kimi-linear"));
    let cfg = spec.arch.clone();
    let kimi = deltafin_engine::arch::kimi_linear::load(&cfg, &Loader::new(&index, &spec)).unwrap();
    let opts = GenerateOptions {
        max_new_tokens: 3,
        prefill_chunk: 4,
        ..Default::default()
    };
    generation_agrees(&kimi, dev, &prompt, &opts, "kimi-linear greedy");
}

/// Generation on the device with the model out of core: DeepSeek-V3 (FP8 experts, 6 layers)
/// under a budget of two streamed layers and three expert slots, so routed experts come through
/// the expert cache and disk reads (host RAM and disk below the device tier). The CPU tokens
/// of the same budgeted model; the store must have missed.
pub fn out_of_core_generation_matches_the_cpu<D: DeviceOps>(dev: &D) {
    let (dir, o) = tight_deepseek();
    let (model, rt) = deltafin_engine::arch::load_budgeted(dir.path(), &o).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 29 + 3) % 200).collect();
    let opts = GenerateOptions {
        max_new_tokens: 4,
        prefill_chunk: 4,
        ..Default::default()
    };
    generation_agrees(model.as_ref(), dev, &prompt, &opts, "deepseek out of core");
    let s = rt.stats();
    assert!(
        s.experts.misses > 0,
        "experts were read from disk: {:?}",
        s.experts
    );
}

/// A 6-layer DeepSeek-V3 (FP8 experts) and a budget of two streamed layers and three expert
/// slots for it: routed experts come through the expert cache and disk reads.
pub fn tight_deepseek() -> (tempfile::TempDir, OocOptions) {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth {
        layers: 6,
        ..DeepseekSynth::tiny(ExpertFormat::Fp8)
    }
    .write(dir.path())
    .unwrap();
    let mut o = OocOptions::with_budget(u64::MAX / 4);
    o.reserve_bytes = 0;
    o.reader.chunk_bytes = 8192;
    let (_, rt) = deltafin_engine::arch::load_budgeted(dir.path(), &o).unwrap();
    let p = &rt.plan;
    o.budget = p.fixed_bytes + 2 * p.layer_bytes.iter().max().unwrap() + 3 * p.slot_bytes;
    (dir, o)
}

/// The HF-generated fixtures of the grouped-query attention and gated DeltaNet families, loaded
/// as `deltafin` loads them: Qwen3 (dense, per-head q/k norms), Qwen3-MoE (softmax routing),
/// GLM-4.5 (partial rotary, biases, sigmoid routing with a shared expert, block FP8),
/// MiniMax-M2 (whole-projection q/k norms, block FP8), gpt-oss (sinks, sliding-window layers,
/// top-k softmax routing, interleaved MXFP4 experts with biases, clamped SwiGLU), Qwen3-Next
/// (fused gated-DeltaNet projections, gated attention, a gated shared expert) and Qwen3.5-MoE
/// (split DeltaNet projections; BF16 and block FP8): a 6-token prefill and two decode steps each.
pub fn gqa_families_match_the_cpu<D: DeviceOps>(dev: &D) {
    let families = [
        "qwen3",
        "qwen3-moe",
        "glm4-moe-fp8",
        "minimax-m2-fp8",
        "gpt-oss",
        "qwen3-next",
        "qwen3.5-moe",
        "qwen3.5-moe-fp8",
    ];
    for name in families {
        let model = deltafin_engine::arch::load(&fixture(name)).unwrap();
        let prompt: Vec<u32> = (0..6).map(|i| (i * 37 + 5) % 200).collect();
        let mut seq = device_sequence(model.as_ref(), dev, 16).unwrap();
        compare(model.as_ref(), &prompt, 3, name, |t| seq.forward(t).unwrap());
        assert_eq!(seq.len(), prompt.len() + 2, "{name}");
    }
}

/// The sparse fixtures in a one-sequence session: a 20-token prefill and two decode steps.
/// * DSA (DeepSeek-V3.2, and GLM-5 whose shared layers reuse the last full layer's choice): past
///   the indexer's top-k (10, 12); the index scores and the attention over the chosen positions
///   on the device.
/// * DeepSeek-V4 (hyper-connections on the device; sliding, compressed sparse and heavily
///   compressed attention projecting on the device): past the window of 8 and 5 closed entries
///   of 4 positions, of which the indexer keeps 3.
pub fn dsa_sessions_match_the_cpu<D: DeviceOps>(dev: &D) {
    for name in ["dsv32-dsa-bf16", "glm5-dsa-fp8", "dsv4-flash"] {
        let model = deltafin_engine::arch::load(&fixture(name)).unwrap();
        let vocab = model.info().vocab_size as u32;
        let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % vocab).collect();
        let mut seq = device_sequence(model.as_ref(), dev, 32).unwrap();
        compare(model.as_ref(), &prompt, 3, name, |t| seq.forward(t).unwrap());
        assert_eq!(seq.len(), prompt.len() + 2, "{name}");
        // Past the session's positions: a typed refusal, not a write past the device's pools.
        let mut short = device_sequence(model.as_ref(), dev, 16).unwrap();
        let err = short.forward(&prompt).err();
        assert!(
            matches!(err, Some(deltafin_engine::Error::ContextOverflow { .. })),
            "{name}: {err:?}"
        );
    }
}
