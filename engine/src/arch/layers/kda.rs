//! Kimi Delta Attention (KDA): Kimi-Linear's variant (HF `KimiLinearDeltaAttention`,
//! `model-formats.md` §3.2) and Kimi K3's (`kimi-k3.md` §1.3).
//!
//! For a normalised input row `x` (all f32):
//! 1. `q̃, k̃, ṽ = W_q x, W_k x, W_v x`; a causal depthwise convolution of width `K` per channel
//!    over the last `K` projected values (history kept in the state), then SiLU;
//! 2. per head, `q` and `k` are L2-normalised (by the oracle's formula, [`L2Norm`]) and `q` is
//!    scaled by `head_dim^-½`;
//! 3. the per-channel log-decay `g` from `f = W_fb(W_fa x) + dt_bias` ([`KdaDecay`]) with
//!    `exp(A_log)` broadcast from its stored shape; `β = σ(W_b x)` per head;
//! 4. the delta rule on the per-head state `S ∈ R^{dk×dv}`: `S ← S ⊙ exp(g)` (along the key
//!    axis), `δ = (v − kᵀS)·β`, `S ← S + k ⊗ δ`, `o = qᵀS`;
//! 5. per head `o ← w ⊙ RMS(o)` (eps `rms_norm_eps`) `⊙ σ(gate)`, gate full-rank or low-rank;
//!    `y = W_o o`.
//!
//! Multi-row passes run every projection as one multi-row matmul and the convolution and
//! recurrence sequentially row by row, so a prefill is bit-identical to token-by-token decoding.
//! Each row's recurrence inputs (raw projections, `k`, `v`, `g`, `β`) are recorded in the
//! sequence's [`KdaCache`] so a pass can be committed to a prefix by replay (see
//! `generate::state`); [`conv_push`] and [`delta_rule_step`] are the shared replay primitives.
//! The first row of a pass reads the pre-pass state out of place ([`delta_rule_step_from`]), so
//! keeping that state for a rollback costs no copy.

use crate::config::KdaDecay;
use crate::generate::{KdaCache, KdaShape};
use crate::kernels::ops::{rms_inv, sigmoid, silu};
use crate::kernels::{Matrix, matmul};

/// The L2 normalisation of q/k; the three oracles use different formulas (model-formats §3.4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum L2Norm {
    /// HF/FLA: `x / sqrt(Σx² + eps)`.
    EpsInside(f32),
    /// `F.normalize` (the K3 reference): `x / max(‖x‖₂, eps)`.
    EpsFloor(f32),
}

impl L2Norm {
    fn apply(self, x: &mut [f32]) {
        let ss: f32 = x.iter().map(|v| v * v).sum();
        let denom = match self {
            L2Norm::EpsInside(eps) => (ss + eps).sqrt(),
            L2Norm::EpsFloor(eps) => ss.sqrt().max(eps),
        };
        x.iter_mut().for_each(|v| *v /= denom);
    }
}

/// The output gate before `o_proj`.
#[derive(Debug, Clone)]
pub enum OutputGate {
    /// Kimi-Linear: `g_b_proj(g_a_proj(x))`.
    LowRank { a: Matrix, b: Matrix },
    /// K3 (`use_full_rank_gate`): `g_proj(x)`.
    Full(Matrix),
}

/// One KDA layer's weights.
#[derive(Debug, Clone)]
pub struct Kda {
    pub shape: KdaShape,
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    /// Depthwise conv weights `[3P, K]` (q channels, then k, then v).
    pub conv: Vec<f32>,
    pub f_a: Matrix,
    pub f_b: Matrix,
    /// `[P]`.
    pub dt_bias: Vec<f32>,
    /// `exp(A_log)` broadcast to `[P]` (channel `h * head_dim + d`).
    pub decay_rate: Vec<f32>,
    pub decay: KdaDecay,
    pub b: Matrix,
    /// `o_norm.weight`, `[head_dim]`.
    pub o_norm: Vec<f32>,
    pub eps: f32,
    pub gate: OutputGate,
    pub o: Matrix,
    pub l2: L2Norm,
    /// `head_dim^-½` applied to q after the L2 norm.
    pub q_scale: f32,
}

/// Broadcast a stored `A_log` to `[heads, head_dim]` by numpy rules: leading unit dims are
/// dropped, then the trailing two dims must each be 1 or the matching size (`[1,1,H,1]` is per
/// head, `[head_dim]` per key channel shared by all heads). Returns `exp(A_log)` per channel.
pub fn broadcast_decay_rate(
    shape: &[usize],
    a_log: &[f32],
    heads: usize,
    head_dim: usize,
) -> Result<Vec<f32>, String> {
    let mut dims: Vec<usize> = shape.to_vec();
    while dims.len() > 2 && dims[0] == 1 {
        dims.remove(0);
    }
    if dims.len() > 2 {
        return Err(format!(
            "shape {shape:?} does not broadcast to [{heads}, {head_dim}]"
        ));
    }
    while dims.len() < 2 {
        dims.insert(0, 1);
    }
    let (rows, cols) = (dims[0], dims[1]);
    if !(rows == 1 || rows == heads) || !(cols == 1 || cols == head_dim) {
        return Err(format!(
            "shape {shape:?} does not broadcast to [{heads}, {head_dim}]"
        ));
    }
    let mut out = Vec::with_capacity(heads * head_dim);
    for h in 0..heads {
        for d in 0..head_dim {
            let i = (if rows == 1 { 0 } else { h }) * cols + if cols == 1 { 0 } else { d };
            out.push(a_log[i].exp());
        }
    }
    Ok(out)
}

/// Where each row of a pass goes: its sequence's KDA cache.
#[derive(Debug)]
pub struct KdaRows<'a, 'c> {
    /// `caches[seq[i]]` is row i's cache.
    pub caches: &'a mut [&'c mut KdaCache],
    pub seq: &'a [usize],
}

/// Multi-row projections of one pass.
struct Projections {
    qkv: Vec<f32>,
    f: Vec<f32>,
    beta: Vec<f32>,
    gate: Vec<f32>,
}

impl Kda {
    fn project(&self, x: &[f32], n: usize) -> Projections {
        let p = self.shape.channels();
        let mm = |m: &Matrix, input: &[f32]| {
            let mut y = vec![0.0f32; n * m.rows];
            matmul(m, input, n, &mut y);
            y
        };
        let (q, k, v) = (mm(&self.q, x), mm(&self.k, x), mm(&self.v, x));
        let mut qkv = Vec::with_capacity(3 * n * p);
        for i in 0..n {
            for part in [&q, &k, &v] {
                qkv.extend_from_slice(&part[i * p..(i + 1) * p]);
            }
        }
        let mut f = mm(&self.f_b, &mm(&self.f_a, x));
        for row in f.chunks_mut(p) {
            row.iter_mut().zip(&self.dt_bias).for_each(|(v, b)| *v += b);
        }
        let gate = match &self.gate {
            OutputGate::LowRank { a, b } => mm(b, &mm(a, x)),
            OutputGate::Full(g) => mm(g, x),
        };
        Projections {
            qkv,
            f,
            beta: mm(&self.b, x),
            gate,
        }
    }

    /// Attention output `[n, hidden]` for normalised rows `x`, advancing each row's sequence
    /// state (rows of one sequence are consecutive positions, in order).
    pub fn forward(&self, x: &[f32], n: usize, rows: &mut KdaRows<'_, '_>) -> Vec<f32> {
        let s = self.shape;
        let (p, heads, hd) = (s.channels(), s.heads, s.head_dim);
        let proj = self.project(x, n);
        let mut o = vec![0.0f32; n * p];
        let mut record = vec![0.0f32; s.record_len()];
        for i in 0..n {
            let cache = &mut *rows.caches[rows.seq[i]];
            cache.begin_rows();
            let raw = &proj.qkv[i * 3 * p..(i + 1) * 3 * p];
            let (rec_raw, rest) = record.split_at_mut(3 * p);
            rec_raw.copy_from_slice(raw);
            let (k, rest) = rest.split_at_mut(p);
            let (v, rest) = rest.split_at_mut(p);
            let (g, beta) = rest.split_at_mut(p);
            let mut q = vec![0.0f32; p];
            self.convolve(cache.conv_history(), raw, &mut q, k, v);
            conv_push(cache.conv_history_mut(), raw, s);
            for h in 0..heads {
                let qh = &mut q[h * hd..(h + 1) * hd];
                self.l2.apply(qh);
                qh.iter_mut().for_each(|x| *x *= self.q_scale);
                self.l2.apply(&mut k[h * hd..(h + 1) * hd]);
            }
            let f = &proj.f[i * p..(i + 1) * p];
            for ((g, &f), &rate) in g.iter_mut().zip(f).zip(&self.decay_rate) {
                *g = match self.decay {
                    KdaDecay::Softplus => -rate * softplus(f),
                    KdaDecay::LowerBound(bound) => bound * sigmoid(rate * f),
                };
            }
            for (b, &logit) in beta.iter_mut().zip(&proj.beta[i * heads..(i + 1) * heads]) {
                *b = sigmoid(logit);
            }
            cache.step(StepInputs { k, v, g, beta });
            let out = &mut o[i * p..(i + 1) * p];
            readout(cache.recurrent(), &q, s, out);
            self.gated_norm(out, &proj.gate[i * p..(i + 1) * p]);
            cache.record(&record);
        }
        let mut y = vec![0.0f32; n * self.o.rows];
        matmul(&self.o, &o, n, &mut y);
        y
    }

    /// Causal depthwise convolution of one row (history + current raw values), then SiLU.
    fn convolve(&self, history: &[f32], raw: &[f32], q: &mut [f32], k: &mut [f32], v: &mut [f32]) {
        let p = self.shape.channels();
        let kernel = self.shape.kernel;
        let width = 3 * p;
        for c in 0..width {
            let w = &self.conv[c * kernel..(c + 1) * kernel];
            let mut acc = 0.0f32;
            for (j, &wj) in w[..kernel - 1].iter().enumerate() {
                acc += history[j * width + c] * wj;
            }
            acc += raw[c] * w[kernel - 1];
            let y = silu(acc);
            match c / p {
                0 => q[c] = y,
                1 => k[c - p] = y,
                _ => v[c - 2 * p] = y,
            }
        }
    }

    /// Per head: `o ← w ⊙ (o · rms_inv(o)) ⊙ σ(gate)`.
    fn gated_norm(&self, o: &mut [f32], gate: &[f32]) {
        let hd = self.shape.head_dim;
        for (oh, gh) in o.chunks_mut(hd).zip(gate.chunks(hd)) {
            let inv = rms_inv(oh, self.eps);
            for ((v, &w), &g) in oh.iter_mut().zip(&self.o_norm).zip(gh) {
                *v = (w * (*v * inv)) * sigmoid(g);
            }
        }
    }
}

/// `log(1 + exp(x))`, linear above 20 (HF's thresholded form).
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}

/// Shift one row of raw projections into the convolution history (oldest row dropped).
pub fn conv_push(history: &mut [f32], raw: &[f32], shape: KdaShape) {
    let width = 3 * shape.channels();
    if shape.kernel <= 1 {
        return;
    }
    history.copy_within(width.., 0);
    let start = history.len() - width;
    history[start..].copy_from_slice(raw);
}

/// One row's delta-rule inputs: normalised `k`, `v`, log-decay `g` (`[P]` each), `β` (`[heads]`).
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

/// One delta-rule step on the state `[heads, dk, dv]`: decay rows by `exp(g)`, then
/// `δ = (v − kᵀS)·β` and `S ← S + k ⊗ δ`. Sums run over the key index in order.
pub fn delta_rule_step(state: &mut [f32], x: StepInputs<'_>, shape: KdaShape) {
    delta_rule_step_from(None, state, x, shape);
}

/// [`delta_rule_step`] reading the pre-step state from `prev` when given (out of place: `state`
/// is overwritten), so a pass can keep the pre-pass state without copying it. Bit-identical to
/// the in-place step.
pub fn delta_rule_step_from(prev: Option<&[f32]>, state: &mut [f32], x: StepInputs<'_>, shape: KdaShape) {
    let StepInputs { k, v, g, beta } = x;
    let d = shape.head_dim;
    let mut delta = vec![0.0f32; d];
    for h in 0..shape.heads {
        let s = &mut state[h * d * d..(h + 1) * d * d];
        let src = prev.map(|p| &p[h * d * d..(h + 1) * d * d]);
        let (kh, vh, gh) = (
            &k[h * d..(h + 1) * d],
            &v[h * d..(h + 1) * d],
            &g[h * d..(h + 1) * d],
        );
        for (i, (row, &gi)) in s.chunks_mut(d).zip(gh).enumerate() {
            let decay = gi.exp();
            match src {
                Some(p) => row
                    .iter_mut()
                    .zip(&p[i * d..(i + 1) * d])
                    .for_each(|(x, &y)| *x = y * decay),
                None => row.iter_mut().for_each(|x| *x *= decay),
            }
        }
        delta.iter_mut().for_each(|x| *x = 0.0);
        for (row, &ki) in s.chunks(d).zip(kh) {
            for (acc, &x) in delta.iter_mut().zip(row) {
                *acc += x * ki;
            }
        }
        for (dj, &vj) in delta.iter_mut().zip(vh) {
            *dj = (vj - *dj) * beta[h];
        }
        for (row, &ki) in s.chunks_mut(d).zip(kh) {
            for (x, &dj) in row.iter_mut().zip(&delta) {
                *x += ki * dj;
            }
        }
    }
}

/// `o = qᵀS` per head (sum over the key index in order).
fn readout(state: &[f32], q: &[f32], shape: KdaShape, out: &mut [f32]) {
    let d = shape.head_dim;
    out.iter_mut().for_each(|x| *x = 0.0);
    for h in 0..shape.heads {
        let s = &state[h * d * d..(h + 1) * d * d];
        let oh = &mut out[h * d..(h + 1) * d];
        for (row, &qi) in s.chunks(d).zip(&q[h * d..(h + 1) * d]) {
            for (acc, &x) in oh.iter_mut().zip(row) {
                *acc += x * qi;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_broadcasts_by_stored_shape() {
        let per_head = broadcast_decay_rate(&[1, 1, 2, 1], &[0.0, 1.0], 2, 3).unwrap();
        assert_eq!(per_head, vec![1.0, 1.0, 1.0, 1f32.exp(), 1f32.exp(), 1f32.exp()]);
        let per_channel = broadcast_decay_rate(&[3], &[0.0, 1.0, 2.0], 2, 3).unwrap();
        assert_eq!(per_channel[..3], per_channel[3..]);
        assert_eq!(per_channel[2], 2f32.exp());
        assert!(
            broadcast_decay_rate(&[2], &[0.0, 1.0], 2, 3).is_err(),
            "[H] with H != head_dim"
        );
        assert!(broadcast_decay_rate(&[2, 2, 3], &[0.0; 12], 2, 3).is_err());
    }

    #[test]
    fn delta_rule_writes_the_value_for_a_unit_key() {
        // One head, d = 2, no decay (g = 0), beta = 1, k = e0: S row 0 becomes v exactly.
        let shape = KdaShape {
            heads: 1,
            head_dim: 2,
            kernel: 1,
        };
        let mut s = vec![0.5, -1.0, 2.0, 3.0];
        let x = StepInputs {
            k: &[1.0, 0.0],
            v: &[4.0, 5.0],
            g: &[0.0, 0.0],
            beta: &[1.0],
        };
        delta_rule_step(&mut s, x, shape);
        assert_eq!(s, vec![4.0, 5.0, 2.0, 3.0]);
        let mut o = vec![0.0; 2];
        readout(&s, &[0.0, 1.0], shape, &mut o);
        assert_eq!(o, vec![2.0, 3.0]);
        // Out of place from a copy of the previous state gives the same bits as in place.
        let x = StepInputs {
            k: &[0.6, 0.8],
            v: &[1.0, -2.0],
            g: &[-0.3, -1.7],
            beta: &[0.7],
        };
        let mut in_place = s.clone();
        delta_rule_step(&mut in_place, x, shape);
        let mut out_of_place = vec![f32::NAN; 4];
        delta_rule_step_from(Some(&s), &mut out_of_place, x, shape);
        assert_eq!(in_place, out_of_place);
    }

    #[test]
    fn l2_formulas_differ_only_near_zero() {
        let mut a = vec![3.0, 4.0];
        let mut b = a.clone();
        L2Norm::EpsFloor(1e-12).apply(&mut a);
        L2Norm::EpsInside(1e-6).apply(&mut b);
        assert_eq!(a, vec![0.6, 0.8]);
        assert!((b[0] - 0.6).abs() < 1e-7);
        let mut z = vec![0.0, 0.0];
        L2Norm::EpsFloor(1e-12).apply(&mut z);
        assert_eq!(z, vec![0.0, 0.0]);
    }
}
