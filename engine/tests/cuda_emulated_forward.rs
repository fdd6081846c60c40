//! A whole DeepSeek-V3 forward pass on a device: every activation and the latent caches in
//! device buffers, every operation a kernel of the CUDA sources (run by the CPU emulator behind
//! `DeviceOps`), orchestrated by `model::layers::device`. Its logits must equal the CPU
//! model's bit for bit, for a prefill and for the decode steps after it, with FP8 and INT4
//! experts (group-limited sigmoid routing with a selection bias, shared experts, a dense first
//! layer, low-rank queries, RoPE).
//!
//! Needs g++ (skipped without it, unless `DELTAFIN_REQUIRE_SERVICES=1`).

mod emulator_support;

use deltafin_engine::arch::deepseek_v3::DeepseekV3;
use deltafin_engine::arch::{LogitRows, Model, SeqInput};
use deltafin_engine::config::{ArchConfig, ModelSpec};
use deltafin_engine::model::Loader;
use deltafin_engine::synth::{DeepseekSynth, ExpertFormat};
use deltafin_engine::weights::WeightIndex;
use emulator_support::EmuDevice;

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

#[test]
fn a_whole_pass_on_the_device_gives_the_cpu_logits() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-forward") else {
        return;
    };
    let dev = EmuDevice {
        bin,
        launches: Default::default(),
    };
    for format in [ExpertFormat::Fp8, ExpertFormat::Int4] {
        let (_dir, model) = load(format);
        let prompt: Vec<u32> = (0..6).map(|i| (i * 37 + 5) % 200).collect();
        let mut state = model.new_state();
        let mut session = model.device_session(&dev, 16).unwrap();
        let mut step: Vec<u32> = prompt.clone();
        for pass in 0..3 {
            let want = model
                .forward(
                    &mut [SeqInput {
                        state: &mut state,
                        tokens: &step,
                        logits: LogitRows::Last,
                    }],
                    None,
                )
                .unwrap();
            let got = session.forward(&step).unwrap();
            assert_eq!(
                bits(&got),
                bits(&want),
                "{format:?} pass {pass}: device logits differ from the CPU"
            );
            let next = deltafin_engine::kernels::ops::argmax(&want) as u32;
            step = vec![next];
        }
        assert_eq!(session.len(), prompt.len() + 2);
    }
    assert!(dev.launches.get() > 50, "{} launches", dev.launches.get());
}
