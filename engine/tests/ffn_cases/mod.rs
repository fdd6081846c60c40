//! The written-once FFN layers (`Mlp::run`, `Moe::run` over `model::layers::ops::Ops`) on a
//! device against the same functions on the CPU, bit for bit, for every form a family stores:
//! split SwiGLU experts under group-limited sigmoid routing with a selection bias and a shared
//! expert (DeepSeek-V3, Kimi); gpt-oss's interleaved `gate_up_proj` with biases and clamped
//! SwiGLU under softmax routing; K3's latent MoE with its norm and SiTU; Qwen3-Next's gated
//! shared expert. Shared by the emulator (`cuda_emulated_forward.rs`) and the GPU (`cuda.rs`).

#![allow(dead_code)]

use deltafin_engine::backend::WeightClass;
use deltafin_engine::backend::device::DeviceOps;
use deltafin_engine::model::layers::device::OnDevice;
use deltafin_engine::model::layers::mlp::{Activation, GateUp, Mlp, MlpBias};
use deltafin_engine::model::layers::moe::{Combine, Latent, Moe, RouterConfig, Scoring};
use deltafin_engine::model::layers::ops::{Host, Ops};

use crate::kernel_support::{bf16_matrix, patterned};

const H: usize = 48;
const ROWS: usize = 5;

/// A split MLP `width` wide on `input` values.
fn split(input: usize, width: usize, act: Activation, seed: u64) -> Mlp {
    let m = |r, c, s| bf16_matrix(r, c, seed * 10 + s);
    Mlp::split(m(width, input, 1), m(width, input, 2), m(input, width, 3), act)
}

/// gpt-oss's expert: one interleaved gate/up product, biases on both products.
fn interleaved(width: usize, seed: u64) -> Mlp {
    Mlp {
        gate_up: GateUp::Interleaved(bf16_matrix(2 * width, H, seed * 10 + 1)),
        down: bf16_matrix(H, width, seed * 10 + 2),
        act: Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        },
        bias: Some(MlpBias {
            gate_up: patterned(2 * width, seed * 10 + 3),
            down: patterned(H, seed * 10 + 4),
        }),
    }
}

fn moe(experts: Vec<Mlp>, router: RouterConfig, bias: Vec<f32>, combine: Combine) -> Moe {
    Moe {
        gate: bf16_matrix(experts.len(), H, 77),
        bias,
        logit_bias: Vec::new(),
        router,
        experts,
        shared: None,
        shared_gate: None,
        latent: None,
        combine,
        hash: None,
    }
}

fn router(scoring: Scoring, top_k: usize, groups: (usize, usize), norm: bool) -> RouterConfig {
    RouterConfig {
        scoring,
        top_k,
        n_group: groups.0,
        topk_group: groups.1,
        norm_topk_prob: norm,
        scaling: 2.5,
    }
}

/// The MoE forms named in the module docs.
fn cases() -> Vec<(&'static str, Moe)> {
    let silu = Activation::Silu;
    let mut deepseek = moe(
        (0..8).map(|e| split(H, 24, silu, e)).collect(),
        router(Scoring::Sigmoid, 3, (4, 2), true),
        patterned(8, 91).iter().map(|b| b * 0.1).collect(),
        Combine::Ascending,
    );
    deepseek.shared = Some(split(H, 32, silu, 50));
    let gpt_oss = moe(
        (0..6).map(|e| interleaved(20, e)).collect(),
        router(Scoring::Softmax, 2, (1, 1), false),
        Vec::new(),
        Combine::RouteOrder,
    );
    let situ = Activation::Situ {
        beta: 3.5,
        linear_beta: Some(7.0),
    };
    let mut k3 = moe(
        (0..8).map(|e| split(24, 16, situ, 20 + e)).collect(),
        router(Scoring::Sigmoid, 2, (1, 1), true),
        Vec::new(),
        Combine::RouteOrder,
    );
    k3.latent = Some(Latent {
        down: bf16_matrix(24, H, 81),
        norm: Some(patterned(24, 82)),
        eps: 1e-6,
        up: bf16_matrix(H, 24, 83),
    });
    k3.shared = Some(split(H, 32, situ, 51));
    let mut qwen_next = moe(
        (0..8).map(|e| split(H, 16, silu, 40 + e)).collect(),
        router(Scoring::Softmax, 3, (1, 1), true),
        Vec::new(),
        Combine::Ascending,
    );
    qwen_next.shared = Some(split(H, 24, silu, 52));
    qwen_next.shared_gate = Some(bf16_matrix(1, H, 84));
    vec![
        ("DeepSeek-V3 sigmoid, groups, bias, shared", deepseek),
        ("gpt-oss interleaved with biases", gpt_oss),
        ("K3 latent, norm, SiTU, shared", k3),
        ("Qwen3-Next gated shared expert", qwen_next),
    ]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every MoE form, and the dense MLP forms, through `dev` and through the CPU: the same bits.
/// DeepSeek-V4's hash-routed and sqrt-softplus layers too.
pub fn ffn_forms_match_the_cpu<D: DeviceOps>(dev: &D) {
    let o = OnDevice(dev);
    let x = patterned(ROWS * H, 5);
    let tokens: Vec<u32> = (0..ROWS as u32).collect();
    for (name, m) in cases() {
        let want = m.run(&Host, &x, ROWS, Some(&tokens), None).unwrap();
        let got = m.run(&o, &o.input(x.clone()).unwrap(), ROWS, Some(&tokens), None);
        let got = o.host(&got.unwrap()).unwrap().into_owned();
        assert_eq!(bits(&got), bits(&want), "{name}: device MoE differs from the CPU");
        assert!(
            want.iter().any(|v| *v != 0.0),
            "{name}: a case that computes nothing"
        );
    }
    for (name, mlp) in [
        ("split", split(H, 24, Activation::Silu, 60)),
        ("interleaved", interleaved(24, 61)),
    ] {
        let want = mlp.run(&Host, WeightClass::Spine, &x, ROWS).unwrap();
        let got = mlp.run(&o, WeightClass::Spine, &o.input(x.clone()).unwrap(), ROWS);
        let got = o.host(&got.unwrap()).unwrap().into_owned();
        assert_eq!(bits(&got), bits(&want), "{name} MLP: device differs from the CPU");
    }
    // DeepSeek-V4's routers: hash-routed (the rows' token ids), then sqrt-softplus scores. The
    // device routes them on the host from its logits; the experts run on the device.
    let (_, mut hashed) = cases().remove(0);
    hashed.hash = Some((0..ROWS as u32 * 3).map(|i| i % 8).collect());
    let (_, mut softplus) = cases().remove(0);
    softplus.router.scoring = Scoring::SqrtSoftplus;
    for (name, m) in [("hash-routed", hashed), ("sqrt-softplus", softplus)] {
        let want = m.run(&Host, &x, ROWS, Some(&tokens), None).unwrap();
        let got = m.run(&o, &o.input(x.clone()).unwrap(), ROWS, Some(&tokens), None);
        let got = o.host(&got.unwrap()).unwrap().into_owned();
        assert_eq!(bits(&got), bits(&want), "{name}: device MoE differs from the CPU");
    }
}
