//! The gated MLP `down(act(gate(x), up(x)))` used as dense FFN, shared expert and routed expert:
//! SwiGLU (`silu(g) * u`) or K3's SiTU (`kimi-k3.md` §1.5).

use crate::backend::{WeightClass, matmul, matmul_expert};
use crate::kernels::Matrix;
pub use crate::kernels::layer_spec::Activation;

/// A gated MLP.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub act: Activation,
}

impl Mlp {
    /// Hidden width.
    pub fn width(&self) -> usize {
        self.gate.rows
    }

    /// `n` rows of `x` (input width) to `n` rows of output width.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        self.forward_as(x, n, WeightClass::Spine)
    }

    /// [`Mlp::forward`] with the weights' device tier (`Expert` for a routed expert).
    pub fn forward_as(&self, x: &[f32], n: usize, class: WeightClass) -> Vec<f32> {
        let mm = match class {
            WeightClass::Spine => matmul,
            WeightClass::Expert => matmul_expert,
        };
        let width = self.width();
        let mut g = vec![0.0f32; n * width];
        let mut u = vec![0.0f32; n * width];
        mm(&self.gate, x, n, &mut g);
        mm(&self.up, x, n, &mut u);
        activate(self.act, &mut g, &u);
        let mut out = vec![0.0f32; n * self.down.rows];
        mm(&self.down, &g, n, &mut out);
        out
    }
}

/// `g ← act(g, u)` elementwise, compiled for the widest vectors the CPU has. The same bits on
/// every path: the activations use IEEE operations and fused multiply-adds only. (A closure
/// under `math::fma_scope` would not do: a body this large is not inlined into the scope, so it
/// ran scalar with `fma` as a libm call, about 6 % of a 4k prefill's samples.)
fn activate(act: Activation, g: &mut [f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("fma") {
            // SAFETY: the CPU reports both features.
            #[allow(unsafe_code)]
            return unsafe { activate_avx512(act, g, u) };
        }
        if has!("avx2") && has!("fma") {
            // SAFETY: as above.
            #[allow(unsafe_code)]
            return unsafe { activate_avx2(act, g, u) };
        }
    }
    activate_loop(act, g, u);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn activate_avx512(act: Activation, g: &mut [f32], u: &[f32]) {
    activate_loop(act, g, u);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn activate_avx2(act: Activation, g: &mut [f32], u: &[f32]) {
    activate_loop(act, g, u);
}

/// One plain loop per activation (the match hoisted), so each vectorises.
#[inline(always)]
fn activate_loop(act: Activation, g: &mut [f32], u: &[f32]) {
    if act == Activation::Silu {
        for (g, &u) in g.iter_mut().zip(u) {
            *g = Activation::Silu.apply(*g, u);
        }
    } else {
        for (g, &u) in g.iter_mut().zip(u) {
            *g = act.apply(*g, u);
        }
    }
}
