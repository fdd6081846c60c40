//! Whole DeepSeek-V3, Kimi-Linear and Kimi K3 forward passes on a device: every activation and the latent caches in
//! device buffers, every operation a kernel of the CUDA sources (run by the CPU emulator behind
//! `DeviceOps`), orchestrated by `model::layers::device`. Its logits must equal the CPU
//! model's bit for bit, for a prefill and for the decode steps after it, with FP8 and INT4
//! experts (group-limited sigmoid routing with a selection bias, shared experts, a dense first
//! layer, low-rank queries, RoPE), and for the HF Kimi-Linear fixture (KDA states, NoPE MLA,
//! 3-of-8 routing summed in ascending id order) and the HF K3 fixture (Block Attention
//! Residuals, gated MLA, latent MoE, SiTU). `engine/tests/cuda.rs` runs the same checks on a
//! GPU.
//!
//! Needs g++ (skipped without it, unless `DELTAFIN_REQUIRE_SERVICES=1`).

mod emulator_support;
mod ffn_cases;
mod forward_cases;
mod kernel_support;

use emulator_support::EmuDevice;

#[test]
fn a_whole_pass_on_the_device_gives_the_cpu_logits() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-forward") else {
        return;
    };
    let dev = EmuDevice::new(&bin);
    forward_cases::device_pass_matches_the_cpu(&dev);
    let launches = dev.launches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(launches > 50, "{launches} launches");
}

#[test]
fn every_ffn_form_on_the_device_gives_the_cpu_bits() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-ffn") else {
        return;
    };
    ffn_cases::ffn_forms_match_the_cpu(&EmuDevice::new(&bin));
}

#[test]
fn whole_passes_of_the_gqa_dsa_and_v4_families_on_the_device_give_the_cpu_logits() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-forward-gqa") else {
        return;
    };
    let dev = EmuDevice::new(&bin);
    forward_cases::gqa_families_match_the_cpu(&dev);
    forward_cases::dsa_sessions_match_the_cpu(&dev);
}

#[test]
fn a_whole_kimi_linear_pass_on_the_device_gives_the_cpu_logits() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-forward-kimi") else {
        return;
    };
    let dev = EmuDevice::new(&bin);
    forward_cases::kimi_linear_pass_matches_the_cpu(&dev);
}

#[test]
fn a_whole_k3_pass_on_the_device_gives_the_cpu_logits() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-forward-k3") else {
        return;
    };
    let dev = EmuDevice::new(&bin);
    forward_cases::k3_pass_matches_the_cpu(&dev);
}

#[test]
fn generation_on_the_device_gives_the_cpu_tokens() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-generate") else {
        return;
    };
    let dev = EmuDevice::new(&bin);
    forward_cases::generation_on_the_device_matches_the_cpu(&dev);
    dev.expert_products.lock().unwrap().clear();
    forward_cases::out_of_core_generation_matches_the_cpu(&dev);
    // Out of core the routed experts come from the host cache's slots, read again as they are
    // evicted; their bytes keep their keys, so a device tier uploads each expert once.
    let products = dev.expert_products.lock().unwrap();
    let uses: usize = products.values().sum();
    assert!(
        uses > 2 * products.len(),
        "expert matrices reused under their keys: {uses} products over {} keys",
        products.len()
    );
}

#[test]
fn served_requests_on_the_device_give_the_cpu_tokens() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-serve") else {
        return;
    };
    let dev: &'static EmuDevice = Box::leak(Box::new(EmuDevice::new(&bin)));
    forward_cases::served::served_requests_match_the_cpu(dev);
}

#[test]
fn served_recurrent_prefill_on_the_device_gives_the_cpu_logits() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-serve-kda") else {
        return;
    };
    let dev: &'static EmuDevice = Box::leak(Box::new(EmuDevice::new(&bin)));
    forward_cases::served::served_recurrent_matches_the_cpu(dev);
}

#[test]
fn served_deepseek_v4_on_the_device_gives_the_cpu_tokens() {
    let Some(bin) = emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-serve-v4") else {
        return;
    };
    let dev: &'static EmuDevice = Box::leak(Box::new(EmuDevice::new(&bin)));
    forward_cases::served::served_v4_matches_the_cpu(dev);
    let launches = dev.launches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(launches > 100, "{launches} launches");
}
