//! The CUDA layer kernels (`engine/src/backend/cuda/layers.cu`) and device math (`math.cuh`),
//! run unchanged on the CPU by the emulator (`cuda_emulator/emulate_layers.cpp`), against the
//! CPU's own functions bit for bit: `kernels::math` over a sweep of the f32 range, RMSNorm
//! (`kernels::ops::rms_norm`), the gated activations (`Activation::apply`), the router
//! (`Moe::route`), the MoE combine (`moe::combine`) and the residual add, launched with the
//! backend's own arguments (`backend::abi`).
//!
//! Needs a C++20 compiler (`g++`); without one the tests are skipped, unless
//! `DELTAFIN_REQUIRE_SERVICES=1` (the README's test command), which makes them fail.

mod emulator_support;
mod kernel_support;
mod layer_cases;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deltafin_engine::backend::abi::{LAYER_FLOATS, LAYER_INTS, LayerLaunch};
use deltafin_engine::kernels::math;
use kernel_support::{assert_same, bytes_of, floats};

fn emulator() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-layers"))
        .as_deref()
}

/// Run one launch on `bufs` (each buffer's bytes), rewriting them with the kernel's results.
fn launch(bin: &Path, l: &LayerLaunch, bufs: &mut [Vec<u8>]) {
    let mut input = Vec::new();
    input.extend(0u32.to_le_bytes());
    input.extend((l.name.len() as u32).to_le_bytes());
    input.extend(l.name.as_bytes());
    for d in l.grid.iter().chain(&l.block) {
        input.extend(d.to_le_bytes());
    }
    input.extend((bufs.len() as u32).to_le_bytes());
    for b in bufs.iter() {
        input.extend((b.len() as u64).to_le_bytes());
        input.extend(b);
    }
    assert_eq!((l.int.len(), l.float.len()), (LAYER_INTS, LAYER_FLOATS));
    input.extend(l.int.iter().flat_map(|v| v.to_le_bytes()));
    input.extend(l.float.iter().flat_map(|v| v.to_le_bytes()));
    let out = emulator_support::run(bin, &input);
    let mut at = 0;
    for b in bufs {
        let len = b.len();
        b.copy_from_slice(&out[at..at + len]);
        at += len;
    }
}

/// Every 4099th f32 bit pattern, a dense run over [1/16, 16) and the edges.
fn sweep() -> Vec<f32> {
    (0..u32::MAX / 4099)
        .map(|i| f32::from_bits(i * 4099))
        .chain((0x3d80_0000u32..0x4180_0000).step_by(61).map(f32::from_bits))
        .chain(math::EDGE_INPUTS)
        .collect()
}

type Unary = fn(f32) -> f32;

#[test]
fn device_math_matches_the_cpu_bit_for_bit() {
    let Some(bin) = emulator() else { return };
    let x = sweep();
    // In the order of the emulator's function numbers.
    let fns: [(&str, Unary); 7] = [
        ("exp", math::exp),
        ("exp_m1", math::exp_m1),
        ("tanh", math::tanh),
        ("ln", math::ln),
        ("ln_1p", math::ln_1p),
        ("sigmoid", math::sigmoid),
        ("softplus", math::softplus),
    ];
    for (id, (name, f)) in fns.iter().enumerate() {
        let mut input = Vec::new();
        input.extend(1u32.to_le_bytes());
        input.extend((id as u32).to_le_bytes());
        input.extend((x.len() as u64).to_le_bytes());
        input.extend(bytes_of(&x));
        let got = floats(&emulator_support::run(bin, &input));
        let want: Vec<f32> = x.iter().map(|&v| f(v)).collect();
        assert_same(&want, &got, &format!("math::{name}"));
    }
}

#[test]
fn rms_norm_matches_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::rms_norm(&|l, b| launch(bin, l, b));
}

#[test]
fn gated_activations_match_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::gated_activations(&|l, b| launch(bin, l, b));
}

#[test]
fn routing_matches_the_cpu_router() {
    let Some(bin) = emulator() else { return };
    layer_cases::routing(&|l, b| launch(bin, l, b));
}

#[test]
fn the_combine_matches_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::combine(&|l, b| launch(bin, l, b));
}

#[test]
fn mla_attention_matches_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::mla_attention(&|l, b| launch(bin, l, b));
}

#[test]
fn dsa_index_scores_match_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::dsa_scores(&|l, b| launch(bin, l, b));
}

#[test]
fn v4_index_scores_match_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::v4_index_scores(&|l, b| launch(bin, l, b));
}

#[test]
fn v4_attention_matches_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::v4_attention(&|l, b| launch(bin, l, b));
}

#[test]
fn dsa_top_k_matches_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::dsa_topk(&|l, b| launch(bin, l, b));
}

#[test]
fn kda_kernels_match_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::kda(&|l, b| launch(bin, l, b));
}

#[test]
fn mla_projections_match_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::mla_projections(&|l, b| launch(bin, l, b));
}

#[test]
fn attn_res_matches_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::attn_res(&|l, b| launch(bin, l, b));
}

#[test]
fn hyper_connections_match_the_cpu() {
    let Some(bin) = emulator() else { return };
    layer_cases::hyper_connections(&|l, b| launch(bin, l, b));
}
