//! The whole-pass device checks shared by the emulator (`cuda_emulated_forward.rs`) and the GPU
//! (`cuda.rs`): DeepSeek-V3, Kimi-Linear and Kimi K3 sessions on the device against the CPU
//! models, logits bit for bit.

#![allow(dead_code)]

use std::path::Path;

use deltafin_engine::arch::deepseek_v3::DeepseekV3;
use deltafin_engine::arch::kimi_k3::KimiK3;
use deltafin_engine::arch::kimi_linear::KimiLinear;
use deltafin_engine::arch::{LogitRows, Model, SeqInput};
use deltafin_engine::backend::device::DeviceOps;
use deltafin_engine::config::{ArchConfig, ModelSpec};
use deltafin_engine::model::Loader;
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_engine::weights::WeightIndex;

/// The config and weights of the checkpoint in `dir`.
fn open(dir: &Path) -> (ModelSpec, WeightIndex) {
    (ModelSpec::load(dir).unwrap(), WeightIndex::open(dir).unwrap())
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
        let (spec, index) = open(dir.path());
        let ArchConfig::DeepseekV3(cfg) = spec.arch.clone() else {
            panic!("a DeepSeek-V3 config")
        };
        let model = DeepseekV3::load(cfg, &Loader::new(&index, &spec)).unwrap();
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
    let (spec, index) = open(&fixture("kimi-linear"));
    let ArchConfig::KimiLinear(cfg) = spec.arch.clone() else {
        panic!("a Kimi-Linear config")
    };
    let model = KimiLinear::load(cfg, &Loader::new(&index, &spec)).unwrap();
    let prompt: Vec<u32> = (0..7).map(|i| (i * 53 + 11) % 300).collect();
    let mut session = model.device_session(dev, 16).unwrap();
    compare(&model, &prompt, 3, "kimi-linear", |t| session.forward(t).unwrap());
    assert_eq!(session.len(), prompt.len() + 2);
}

/// The HF-generated K3 fixture (Block Attention Residuals, KDA and gated MLA, latent MoE with
/// a normalised expert sum, SiTU, router-order combine): a 5-token prefill and one decode step
/// (fewer than the others: the emulator is slow on this fixture).
pub fn k3_pass_matches_the_cpu<D: DeviceOps>(dev: &D) {
    let (spec, index) = open(&fixture("k3"));
    let ArchConfig::KimiK3(cfg) = spec.arch.clone() else {
        panic!("a K3 config")
    };
    let model = KimiK3::load(cfg, &Loader::new(&index, &spec)).unwrap();
    let prompt: Vec<u32> = (0..5).map(|i| (i * 41 + 3) % 300).collect();
    let mut session = model.device_session(dev, 16).unwrap();
    compare(&model, &prompt, 2, "k3", |t| session.forward(t).unwrap());
    assert_eq!(session.len(), prompt.len() + 1);
}
