//! The gated MLP `down(act(gate(x)) * up(x))` used as dense FFN, shared expert and routed expert.

use crate::kernels::{Matrix, matmul};

/// Gate activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `x * sigmoid(x)` (computed as `x / (1 + e^-x)`, as torch does).
    Silu,
}

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
        let width = self.width();
        let mut g = vec![0.0f32; n * width];
        let mut u = vec![0.0f32; n * width];
        matmul(&self.gate, x, n, &mut g);
        matmul(&self.up, x, n, &mut u);
        for (g, u) in g.iter_mut().zip(&u) {
            *g = match self.act {
                Activation::Silu => *g / (1.0 + (-*g).exp()),
            } * u;
        }
        let mut out = vec![0.0f32; n * self.down.rows];
        matmul(&self.down, &g, n, &mut out);
        out
    }
}
