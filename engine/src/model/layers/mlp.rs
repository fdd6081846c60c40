//! The gated MLP `down(act(gate(x), up(x)))` used as dense FFN, shared expert and routed expert:
//! SwiGLU (`silu(g) * u`), K3's SiTU (`kimi-k3.md` §1.5) or gpt-oss's clamped SwiGLU. The gate
//! and up projections are two matrices, or one whose rows alternate gate and up (gpt-oss's
//! `gate_up_proj`, used as stored: one product, outputs de-interleaved); optional biases are
//! added to the products before the activation and after `down`, as `x @ W + b` does.

use super::ops::{Host, Ops};
use crate::backend::WeightClass;
use crate::error::Result;
use crate::kernels::Matrix;
pub use crate::kernels::layer_spec::Activation;

/// How the gate and up projections are stored.
#[derive(Debug, Clone)]
pub enum GateUp {
    /// `gate_proj` and `up_proj`, `[width, in]` each.
    Split { gate: Matrix, up: Matrix },
    /// One `[2 · width, in]` matrix, row `2j` gate `j` and row `2j + 1` up `j`.
    Interleaved(Matrix),
}

/// Biases of a gated MLP (gpt-oss experts).
#[derive(Debug, Clone)]
pub struct MlpBias {
    /// `2 · width` values in the stored order of the gate/up outputs (split: gate then up;
    /// interleaved: alternating).
    pub gate_up: Vec<f32>,
    /// One per output.
    pub down: Vec<f32>,
}

/// A gated MLP.
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate_up: GateUp,
    pub down: Matrix,
    pub act: Activation,
    pub bias: Option<MlpBias>,
}

impl Mlp {
    /// The usual split SwiGLU/SiTU MLP without biases.
    pub fn split(gate: Matrix, up: Matrix, down: Matrix, act: Activation) -> Mlp {
        Mlp {
            gate_up: GateUp::Split { gate, up },
            down,
            act,
            bias: None,
        }
    }

    /// Hidden width.
    pub fn width(&self) -> usize {
        match &self.gate_up {
            GateUp::Split { gate, .. } => gate.rows,
            GateUp::Interleaved(w) => w.rows / 2,
        }
    }

    /// The same MLP with every matrix mapped by `f` (staging copies).
    pub fn map_matrices(&self, f: impl Fn(&Matrix) -> Matrix) -> Mlp {
        Mlp {
            gate_up: match &self.gate_up {
                GateUp::Split { gate, up } => GateUp::Split {
                    gate: f(gate),
                    up: f(up),
                },
                GateUp::Interleaved(w) => GateUp::Interleaved(f(w)),
            },
            down: f(&self.down),
            act: self.act,
            bias: self.bias.clone(),
        }
    }

    /// `n` rows of `x` (input width) to `n` rows of output width, on the CPU.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        self.forward_as(x, n, WeightClass::Spine)
    }

    /// [`Mlp::forward`] with the weights' device tier (`Expert` for a routed expert).
    pub fn forward_as(&self, x: &[f32], n: usize, class: WeightClass) -> Vec<f32> {
        self.run(&Host, class, &x.to_vec(), n)
            .expect("the CPU runs every MLP form")
    }

    /// The MLP over `n` rows of `x` on `o`'s device, the weights kept as `class`: the gate and
    /// up products (one interleaved product de-interleaved), their biases, the activation, the
    /// down product and its bias.
    pub fn run<O: Ops>(&self, o: &O, class: WeightClass, x: &O::Buf, n: usize) -> Result<O::Buf> {
        let width = self.width();
        let bias = self.bias.as_ref();
        let (g, u) = match &self.gate_up {
            GateUp::Split { gate, up } => {
                let (mut g, mut u) = (o.project(gate, class, x, n)?, o.project(up, class, x, n)?);
                if let Some(b) = bias {
                    let (bg, bu) = b.gate_up.split_at(width);
                    g = o.add_rows(g, bg, n, width)?;
                    u = o.add_rows(u, bu, n, width)?;
                }
                (g, u)
            }
            GateUp::Interleaved(w) => {
                let mut gu = o.project(w, class, x, n)?;
                if let Some(b) = bias {
                    gu = o.add_rows(gu, &b.gate_up, n, 2 * width)?;
                }
                // Pairs (gate, up) per hidden unit: two one-column slices of `n · width` rows.
                let half = |col| o.assemble(n * width, &[(&gu, (2, col, 1))]);
                (half(0)?, half(1)?)
            }
        };
        let g = o.activate(g, &u, self.act, n * width)?;
        let out = o.project(&self.down, class, &g, n)?;
        match bias {
            Some(b) => o.add_rows(out, &b.down, n, self.down.rows),
            None => Ok(out),
        }
    }
}

/// `g ← act(g, u)` elementwise, compiled for the widest vectors the CPU has. The same bits on
/// every path: the activations use IEEE operations and fused multiply-adds only. (A closure
/// under `math::fma_scope` would not do: a body this large is not inlined into the scope, so it
/// ran scalar with `fma` as a libm call, about 6 % of a 4k prefill's samples.)
pub(super) fn activate(act: Activation, g: &mut [f32], u: &[f32]) {
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
