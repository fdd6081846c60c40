//! The whole-pass device checks shared by the emulator (`cuda_emulated_forward.rs`) and the GPU
//! (`cuda.rs`): DeepSeek-V3, Kimi-Linear and Kimi K3 sessions on the device against the CPU
//! models, logits bit for bit.

#![allow(dead_code)]

use deltafin_engine::arch::deepseek_v3::DeepseekV3;
use deltafin_engine::arch::kimi_k3::KimiK3;
use deltafin_engine::arch::kimi_linear::KimiLinear;
use deltafin_engine::arch::{LogitRows, Model, SeqInput};
use deltafin_engine::backend::device::DeviceOps;
use deltafin_engine::config::{ArchConfig, ModelSpec};
use deltafin_engine::model::Loader;
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_engine::weights::WeightIndex;

fn load(format: ExpertFormat) -> (tempfile::TempDir, DeepseekV3) {
    let dir = tempfile::tempdir().unwrap();
    DeepseekSynth::tiny(format).write(dir.path()).unwrap();
    let spec = ModelSpec::load(dir.path()).unwrap();
    let index = WeightIndex::open(dir.path()).unwrap();
    let ArchConfig::DeepseekV3(cfg) = spec.arch.clone() else {
        panic!("a DeepSeek-V3 config")
    };
    let model = DeepseekV3::load(cfg, &Loader::new(&index, &spec)).unwrap();
    (dir, model)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A 6-token prefill and two decode steps (greedy) on `dev` and on the CPU, with FP8 and INT4
/// experts: the last row's logits of every pass must be the same bits.
pub fn device_pass_matches_the_cpu<D: DeviceOps>(dev: &D) {
    for format in [ExpertFormat::Fp8, ExpertFormat::Int4] {
        let (_dir, model) = load(format);
        let prompt: Vec<u32> = (0..6).map(|i| (i * 37 + 5) % 200).collect();
        let mut state = model.new_state();
        let mut session = model.device_session(dev, 16).unwrap();
        let mut step = prompt.clone();
        for pass in 0..3 {
            let input = SeqInput {
                state: &mut state,
                tokens: &step,
                logits: LogitRows::Last,
            };
            let want = model.forward(&mut [input], None).unwrap();
            let got = session.forward(&step).unwrap();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{format:?} pass {pass}: device logits differ from the CPU"
            );
            step = vec![deltafin_engine::kernels::ops::argmax(&want) as u32];
        }
        assert_eq!(session.len(), prompt.len() + 2);
    }
}

/// The HF-generated Kimi-Linear fixture (KDA and NoPE-MLA layers, a dense first FFN, MoE with
/// 3 of 8 experts and a shared expert): a 7-token prefill and two decode steps on `dev` and on
/// the CPU, the last row's logits the same bits.
pub fn kimi_linear_pass_matches_the_cpu<D: DeviceOps>(dev: &D) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kimi-linear");
    let spec = ModelSpec::load(&dir).unwrap();
    let index = WeightIndex::open(&dir).unwrap();
    let ArchConfig::KimiLinear(cfg) = spec.arch.clone() else {
        panic!("a Kimi-Linear config")
    };
    let model = KimiLinear::load(cfg, &Loader::new(&index, &spec)).unwrap();
    let prompt: Vec<u32> = (0..7).map(|i| (i * 53 + 11) % 300).collect();
    let mut state = model.new_state();
    let mut session = model.device_session(dev, 16).unwrap();
    let mut step = prompt.clone();
    for pass in 0..3 {
        let input = SeqInput {
            state: &mut state,
            tokens: &step,
            logits: LogitRows::Last,
        };
        let want = model.forward(&mut [input], None).unwrap();
        let got = session.forward(&step).unwrap();
        assert_eq!(
            bits(&got),
            bits(&want),
            "kimi-linear pass {pass}: device logits differ from the CPU"
        );
        step = vec![deltafin_engine::kernels::ops::argmax(&want) as u32];
    }
    assert_eq!(session.len(), prompt.len() + 2);
}

/// The HF-generated K3 fixture (Block Attention Residuals, KDA and gated MLA, latent MoE with
/// a normalised expert sum, SiTU, router-order combine): a 5-token prefill and one decode step
/// on `dev` and on the CPU (fewer than the others: the emulator is slow on this fixture), the
/// last row's logits the same bits.
pub fn k3_pass_matches_the_cpu<D: DeviceOps>(dev: &D) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k3");
    let spec = ModelSpec::load(&dir).unwrap();
    let index = WeightIndex::open(&dir).unwrap();
    let ArchConfig::KimiK3(cfg) = spec.arch.clone() else {
        panic!("a K3 config")
    };
    let model = KimiK3::load(cfg, &Loader::new(&index, &spec)).unwrap();
    let prompt: Vec<u32> = (0..5).map(|i| (i * 41 + 3) % 300).collect();
    let mut state = model.new_state();
    let mut session = model.device_session(dev, 16).unwrap();
    let mut step = prompt.clone();
    for pass in 0..2 {
        let input = SeqInput {
            state: &mut state,
            tokens: &step,
            logits: LogitRows::Last,
        };
        let want = model.forward(&mut [input], None).unwrap();
        let got = session.forward(&step).unwrap();
        assert_eq!(
            bits(&got),
            bits(&want),
            "k3 pass {pass}: device logits differ from the CPU"
        );
        step = vec![deltafin_engine::kernels::ops::argmax(&want) as u32];
    }
    assert_eq!(session.len(), prompt.len() + 1);
}
