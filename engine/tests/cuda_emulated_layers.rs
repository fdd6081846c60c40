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

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use deltafin_engine::backend::abi::{self, LAYER_FLOATS, LAYER_INTS, LayerLaunch};
use deltafin_engine::kernels::{Format, Matrix, math, ops};
use deltafin_engine::model::layers::mlp::Activation;
use deltafin_engine::model::layers::moe::{self, Combine, Moe, RouterConfig, Scoring};
use deltafin_engine::weights::Blob;
use emulator_support::{bytes_of, floats};
use kernel_support::{Rng, assert_same, patterned};

fn emulator() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| emulator_support::compile("emulate_layers.cpp", "deltafin-cuda-layers"))
        .as_deref()
}

/// Run one launch on `bufs` (each buffer's bytes); the buffers afterwards.
fn launch(bin: &Path, l: &LayerLaunch, bufs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut input = Vec::new();
    input.extend(0u32.to_le_bytes());
    input.extend((l.name.len() as u32).to_le_bytes());
    input.extend(l.name.as_bytes());
    for d in l.grid.iter().chain(&l.block) {
        input.extend(d.to_le_bytes());
    }
    input.extend((bufs.len() as u32).to_le_bytes());
    for b in bufs {
        input.extend((b.len() as u64).to_le_bytes());
        input.extend(b);
    }
    assert_eq!((l.int.len(), l.float.len()), (LAYER_INTS, LAYER_FLOATS));
    input.extend(l.int.iter().flat_map(|v| v.to_le_bytes()));
    input.extend(l.float.iter().flat_map(|v| v.to_le_bytes()));
    let out = emulator_support::run(bin, &input);
    let mut at = 0;
    bufs.iter()
        .map(|b| {
            at += b.len();
            out[at - b.len()..at].to_vec()
        })
        .collect()
}

/// Every 4099th f32 bit pattern, a dense run over [1/16, 16) and the edges.
fn sweep() -> Vec<f32> {
    let edges = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        88.72283,
        -103.97208,
        -17.5,
        9.1,
        20.0,
        f32::MIN_POSITIVE,
        1e-45,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    (0..u32::MAX / 4099)
        .map(|i| f32::from_bits(i * 4099))
        .chain((0x3d80_0000u32..0x4180_0000).step_by(61).map(f32::from_bits))
        .chain(edges)
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
    for (i, &(rows, width)) in [(1, 1), (3, 15), (17, 16), (5, 300), (20, 7)].iter().enumerate() {
        let x = patterned(rows * width, 40 + i as u64);
        let w = patterned(width, 50 + i as u64);
        let eps = 1e-6;
        let mut want = vec![0.0; rows * width];
        for (o, r) in want.chunks_mut(width).zip(x.chunks(width)) {
            ops::rms_norm(r, &w, eps, o);
        }
        let l = abi::rms_norm(rows, width, eps);
        let out = launch(bin, &l, &[bytes_of(&x), bytes_of(&w), vec![0; 4 * rows * width]]);
        assert_same(&want, &floats(&out[2]), &format!("rms_norm {rows}x{width}"));
    }
}

#[test]
fn gated_activations_match_the_cpu() {
    let Some(bin) = emulator() else { return };
    let n = 5000;
    let scale = |v: Vec<f32>, s: f32| v.into_iter().map(|x| x * s).collect::<Vec<_>>();
    let g = scale(patterned(n, 7), 12.0);
    let u = scale(patterned(n, 8), 9.0);
    for act in [
        Activation::Silu,
        Activation::Situ { beta: 10.0, linear_beta: None },
        Activation::Situ { beta: 3.5, linear_beta: Some(7.0) },
    ] {
        let want: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| act.apply(g, u)).collect();
        let out = launch(bin, &abi::gated_act(n, act), &[bytes_of(&g), bytes_of(&u), vec![0; 4 * n]]);
        assert_same(&want, &floats(&out[2]), &format!("{act:?}"));
    }
    let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
    let out = launch(bin, &abi::add(n), &[bytes_of(&g), bytes_of(&u), vec![0; 4 * n]]);
    assert_same(&want, &floats(&out[2]), "add");
}

fn moe_with(experts: usize, bias: Vec<f32>, router: RouterConfig) -> Moe {
    let gate = Matrix::new(Format::F32, experts, 1, Blob::from_vec(vec![0; 4 * experts]), None).unwrap();
    Moe {
        gate,
        bias,
        router,
        experts: Vec::new(),
        shared: None,
        latent: None,
        combine: Combine::RouteOrder,
    }
}

/// Router logits with ties (repeated values) and either sign.
fn logits(rows: usize, experts: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..rows * experts)
        .map(|_| match rng.next() % 8 {
            0 => 0.25,
            1 => -1.5,
            _ => rng.unit() * 6.0,
        })
        .collect()
}

#[test]
fn routing_matches_the_cpu_router() {
    let Some(bin) = emulator() else { return };
    let cases = [
        (16, true, Scoring::Sigmoid, 4, 2, 4, true, 2.5),
        (64, true, Scoring::Sigmoid, 8, 4, 8, true, 2.827),
        (12, false, Scoring::Softmax, 1, 1, 3, true, 1.0),
        (10, false, Scoring::Softmax, 1, 1, 4, false, 1.0),
        (9, true, Scoring::Sigmoid, 1, 1, 9, false, 1.5),
    ];
    for (c, &(e, biased, scoring, n_group, topk_group, top_k, norm, scaling)) in cases.iter().enumerate() {
        let rows = 37;
        let router = RouterConfig {
            scoring,
            top_k,
            n_group,
            topk_group,
            norm_topk_prob: norm,
            scaling,
        };
        let bias = if biased { patterned(e, 90 + c as u64) } else { Vec::new() };
        let moe = moe_with(e, bias.clone(), router.clone());
        let l = logits(rows, e, 70 + c as u64);
        let scratch = abi::route_scratch(rows, e, n_group);
        let bufs = [
            bytes_of(&l),
            bytes_of(&bias),
            vec![0; 4 * rows * top_k],
            vec![0; 4 * rows * top_k],
            vec![0; 4 * scratch],
        ];
        let out = launch(bin, &abi::route(rows, e, &router), &bufs);
        let ids: Vec<i32> = out[2].chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
        let weights = floats(&out[3]);
        for r in 0..rows {
            let want = moe.route(&l[r * e..(r + 1) * e]);
            let got_ids: Vec<usize> = ids[r * top_k..][..want.len()].iter().map(|&i| i as usize).collect();
            let want_ids: Vec<usize> = want.iter().map(|w| w.0).collect();
            assert_eq!(got_ids, want_ids, "case {c} row {r}: experts");
            let want_w: Vec<f32> = want.iter().map(|w| w.1).collect();
            assert_same(&want_w, &weights[r * top_k..][..want.len()], &format!("case {c} row {r}: weights"));
            assert!(ids[r * top_k + want.len()..(r + 1) * top_k].iter().all(|&i| i == -1));
        }
    }
}

#[test]
fn the_combine_matches_the_cpu() {
    let Some(bin) = emulator() else { return };
    let (rows, width) = (9, 37);
    let mut rng = Rng(5);
    let mut offsets = vec![0usize];
    for _ in 0..rows {
        offsets.push(offsets.last().unwrap() + (rng.next() % 5) as usize);
    }
    let slots = *offsets.last().unwrap();
    let results = patterned(slots * width, 11);
    let weights = patterned(slots, 12);
    let want = moe::combine(&results, &weights, &offsets, width);
    let off32: Vec<u8> = offsets.iter().flat_map(|&o| (o as i32).to_le_bytes()).collect();
    let bufs = [bytes_of(&results), bytes_of(&weights), off32, vec![0; 4 * rows * width]];
    let out = launch(bin, &abi::combine(rows, width), &bufs);
    assert_same(&want, &floats(&out[3]), "combine");
}
