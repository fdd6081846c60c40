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
//! Multi-row passes run every projection as one multi-row matmul and the convolution row by
//! row; the recurrence runs per `(sequence, head)` — on all cores for large passes — each over
//! its rows in order with the same operations as one-row decoding, so a prefill is bit-identical
//! to token-by-token decoding whatever the split.
//! Each row's recurrence inputs (raw projections, `k`, `v`, `g`, `β`) are recorded in the
//! sequence's [`KdaCache`] so a pass can be committed to a prefix by replay (see
//! `state`); [`conv_push`] and [`delta_rule_step`] (from `state::recurrence`) are the shared replay primitives.
//! The first row of a pass reads the pre-pass state out of place ([`delta_rule_step_from`]), so
//! keeping that state for a rollback costs no copy.

use super::ops::{Host, Ops};
use crate::backend::WeightClass;
use crate::config::{KdaConfig, KdaDecay};
use crate::error::{Error, Result};
use crate::kernels::Matrix;
pub use crate::kernels::layer_spec::L2Norm;
use crate::kernels::math::{self, exp};
use crate::kernels::ops::{rms_inv, sigmoid, silu};
use crate::model::Loader;
use crate::state::recurrence::head_step_with;
pub use crate::state::recurrence::{StepInputs, conv_push, delta_rule_step, delta_rule_step_from};
use crate::state::{KdaCache, KdaShape};

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

impl Kda {
    /// Load the KDA layer `{a}.*` (Kimi-Linear's and K3's names: `{q,k,v}_proj`,
    /// `{q,k,v}_conv1d`, `f_a_proj`/`f_b_proj`, `A_log`, `dt_bias`, `b_proj`, the output gate
    /// `g_proj` or `g_a_proj`/`g_b_proj`, `o_norm`, `o_proj`) for a model of width `hidden`.
    pub fn load(ld: &Loader<'_>, a: &str, hidden: usize, k: &KdaConfig, l2: L2Norm, eps: f32) -> Result<Kda> {
        let h = hidden;
        let shape = KdaShape {
            heads: k.num_heads,
            head_dim: k.head_dim,
            kernel: k.short_conv_kernel_size,
        };
        let pw = shape.channels();
        let mut conv = Vec::with_capacity(3 * pw * shape.kernel);
        for s in ["q", "k", "v"] {
            conv.extend(ld.floats(&format!("{a}.{s}_conv1d.weight"), &[pw, 1, shape.kernel])?);
        }
        let a_log_name = format!("{a}.A_log");
        let (a_shape, a_log) = ld.floats_any_shape(&a_log_name)?;
        let decay_rate =
            broadcast_decay_rate(&a_shape, &a_log, k.num_heads, k.head_dim).map_err(|reason| {
                Error::TensorShape {
                    path: ld.path_of(&a_log_name),
                    name: format!("{} ({reason})", ld.full_name(&a_log_name)),
                    expected: vec![k.head_dim],
                    found: a_shape.clone(),
                }
            })?;
        let gate = if k.use_full_rank_gate {
            OutputGate::Full(ld.linear(&format!("{a}.g_proj"), pw, h)?)
        } else {
            OutputGate::LowRank {
                a: ld.linear(&format!("{a}.g_a_proj"), k.head_dim, h)?,
                b: ld.linear(&format!("{a}.g_b_proj"), pw, k.head_dim)?,
            }
        };
        Ok(Kda {
            shape,
            q: ld.linear(&format!("{a}.q_proj"), pw, h)?,
            k: ld.linear(&format!("{a}.k_proj"), pw, h)?,
            v: ld.linear(&format!("{a}.v_proj"), pw, h)?,
            conv,
            f_a: ld.linear(&format!("{a}.f_a_proj"), k.head_dim, h)?,
            f_b: ld.linear(&format!("{a}.f_b_proj"), pw, k.head_dim)?,
            dt_bias: ld.vector(&format!("{a}.dt_bias"), pw)?,
            decay_rate,
            decay: k.decay,
            b: ld.linear(&format!("{a}.b_proj"), k.num_heads, h)?,
            o_norm: ld.vector(&format!("{a}.o_norm.weight"), k.head_dim)?,
            eps,
            gate,
            o: ld.linear(&format!("{a}.o_proj"), h, pw)?,
            l2,
            q_scale: (1.0 / (k.head_dim as f64).sqrt()) as f32,
        })
    }
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
            out.push(exp(a_log[i]));
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
    /// Where a sequence's delta rule may run instead of the host (a device), for the sequences
    /// it [takes](SeqRecurrence::takes).
    pub elsewhere: Option<&'a mut dyn SeqRecurrence>,
}

/// One sequence's delta rule and read-out over a pass's rows, run outside the host (a
/// device), with the host recurrence's bits.
pub trait SeqRecurrence: std::fmt::Debug {
    /// Whether a sequence's `rows` rows of a pass run here.
    fn takes(&self, rows: usize) -> bool;

    /// The rows' recurrence: the pre-pass state (`prev`, or `live` itself when the pass has
    /// stepped it already) stepped through `rows` into `live`; the rows' read-outs `[m, P]`.
    fn run(&mut self, rows: SeqRows<'_>, state: (Option<&[f32]>, &mut [f32])) -> Result<Vec<f32>>;
}

/// One sequence's rows of a pass as the recurrence reads them: per row the normalised
/// `[q | k | v]` (`3P`), the log-decay `g` (`P`) and `β` (per head).
#[derive(Debug)]
pub struct SeqRows<'a> {
    pub qkv: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub rows: usize,
}

/// A delta-rule layer (KDA or gated DeltaNet) as a pass drives it: its written-once
/// projections around a core, and the CPU's core over host states.
pub(crate) trait DeltaLayer {
    /// The layer over `n` normalised rows on `o`'s device, the projections handed to `core`.
    fn run<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        core: impl FnOnce(KdaProjected<O::Buf>) -> Result<O::Buf>,
    ) -> Result<O::Buf>;

    /// The CPU's core over `n` projected rows, advancing each row's host state.
    fn host_core(
        &self,
        proj: KdaProjected<Vec<f32>>,
        n: usize,
        rows: &mut KdaRows<'_, '_>,
    ) -> Result<Vec<f32>>;

    /// The layer's state shape.
    fn state_shape(&self) -> KdaShape;
}

/// Each delta-rule layer's own `run` and `host_core` as its [`DeltaLayer`].
macro_rules! delta_layer {
    ($layer:ty) => {
        impl DeltaLayer for $layer {
            fn run<O: Ops>(
                &self,
                o: &O,
                x: &O::Buf,
                n: usize,
                core: impl FnOnce(KdaProjected<O::Buf>) -> Result<O::Buf>,
            ) -> Result<O::Buf> {
                <$layer>::run(self, o, x, n, core)
            }

            fn host_core(
                &self,
                proj: KdaProjected<Vec<f32>>,
                n: usize,
                rows: &mut KdaRows<'_, '_>,
            ) -> Result<Vec<f32>> {
                <$layer>::host_core(self, proj, n, rows)
            }

            fn state_shape(&self) -> KdaShape {
                self.shape
            }
        }
    };
}

delta_layer!(Kda);
delta_layer!(super::gated_deltanet::GatedDeltaNet);

/// What [`Kda::run`] hands its core: raw `[q | k | v]` per row (`3P`, before the convolution),
/// the decay input `f_b(f_a x)` per channel (`P`, before `dt_bias`), the `β` logits per head
/// and the output gate's input per channel (`P`).
#[derive(Debug)]
pub struct KdaProjected<B> {
    pub qkv: B,
    pub f: B,
    pub beta: B,
    pub gate: B,
}

/// Multi-row projections of one pass, as the shared recurrence reads them.
pub(crate) struct Projections {
    /// Raw `[q | k | v]` per row (`3P`), before the convolution.
    pub qkv: Vec<f32>,
    /// The decay input per channel (`P`), `dt_bias` added.
    pub f: Vec<f32>,
    /// `β` logits per head.
    pub beta: Vec<f32>,
    /// The output gate's input per channel (`P`).
    pub gate: Vec<f32>,
}

/// How the output gate's input acts on the normalised read-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateActivation {
    /// KDA: `σ(gate)`.
    Sigmoid,
    /// Gated DeltaNet (HF `RMSNormGated`): `silu(gate)`.
    Silu,
}

/// The per-channel constants of a delta-rule layer (KDA or gated DeltaNet) that the shared
/// convolution, recurrence and gated norm read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeltaCore<'a> {
    pub shape: KdaShape,
    /// Depthwise conv weights `[3P, K]`.
    pub conv: &'a [f32],
    pub l2: L2Norm,
    pub q_scale: f32,
    /// `exp(A_log)` per channel `[P]`.
    pub decay_rate: &'a [f32],
    pub decay: KdaDecay,
    /// The read-out norm's weight `[head_dim]` and epsilon.
    pub o_norm: &'a [f32],
    pub eps: f32,
    pub gate: GateActivation,
}

impl Kda {
    /// The layer over `n` normalised rows `x` on `o`'s device, written once: the projections
    /// ([`KdaProjected`]) go to the device's `core` (convolution, norms, gates, the delta rule on
    /// the rows' states and the gated norm: the read-out `[n, P]`), then `o_proj`.
    pub fn run<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        core: impl FnOnce(KdaProjected<O::Buf>) -> Result<O::Buf>,
    ) -> Result<O::Buf> {
        let (p, spine) = (self.shape.channels(), WeightClass::Spine);
        let [q, k, v] = [&self.q, &self.k, &self.v].map(|m| o.project(m, spine, x, n));
        let (q, k, v) = (q?, k?, v?);
        let qkv = o.assemble(n, &[(&q, (p, 0, p)), (&k, (p, 0, p)), (&v, (p, 0, p))])?;
        let f = o.project(&self.f_b, spine, &o.project(&self.f_a, spine, x, n)?, n)?;
        let gate = match &self.gate {
            OutputGate::LowRank { a, b } => o.project(b, spine, &o.project(a, spine, x, n)?, n)?,
            OutputGate::Full(g) => o.project(g, spine, x, n)?,
        };
        let read = core(KdaProjected {
            qkv,
            f,
            beta: o.project(&self.b, spine, x, n)?,
            gate,
        })?;
        o.project(&self.o, spine, &read, n)
    }

    /// Attention output `[n, hidden]` for normalised rows `x`, advancing each row's sequence
    /// state (rows of one sequence are consecutive positions, in order).
    ///
    /// Three phases: the per-row channel work (convolution, norms, decay, β) runs in row order,
    /// as the convolution history requires; the delta rule and read-out then run per
    /// `(sequence, head)` — independent recurrences — on all cores when the pass is large
    /// enough, each over its rows in order ([`head_step_with`], [`head_readout`]: the operations of
    /// the sequential twin, so the bits do not depend on the split); last the gated norm.
    pub fn forward(&self, x: &[f32], n: usize, rows: &mut KdaRows<'_, '_>) -> Vec<f32> {
        self.run(&Host, &x.to_vec(), n, |proj| self.host_core(proj, n, rows))
            .expect("the CPU runs every KDA form")
    }

    /// The CPU's delta-rule core over `n` projected rows, advancing each row's host state (the
    /// read-out `[n, P]`, before `o_proj`).
    pub(crate) fn host_core(
        &self,
        proj: KdaProjected<Vec<f32>>,
        n: usize,
        rows: &mut KdaRows<'_, '_>,
    ) -> Result<Vec<f32>> {
        let proj = Projections {
            f: Host.add_rows(proj.f, &self.dt_bias, n, self.shape.channels())?,
            qkv: proj.qkv,
            beta: proj.beta,
            gate: proj.gate,
        };
        self.core().run(&proj, n, rows)
    }

    /// The constants the shared recurrence reads.
    fn core(&self) -> DeltaCore<'_> {
        DeltaCore {
            shape: self.shape,
            conv: &self.conv,
            l2: self.l2,
            q_scale: self.q_scale,
            decay_rate: &self.decay_rate,
            decay: self.decay,
            o_norm: &self.o_norm,
            eps: self.eps,
            gate: GateActivation::Sigmoid,
        }
    }
}

impl DeltaCore<'_> {
    /// The read-out of `n` rows `[n, P]` from their projections, advancing each row's sequence
    /// state: per-row channel work in order, the delta rule per `(sequence, head)`, then the
    /// gated norm (see [`Kda::forward`]).
    pub(crate) fn run(&self, proj: &Projections, n: usize, rows: &mut KdaRows<'_, '_>) -> Result<Vec<f32>> {
        let s = self.shape;
        let p = s.channels();
        let inputs = self.channel_phase(proj, n, rows);
        let mut o = vec![0.0f32; n * p];
        let parallel = n * s.heads * 3 * s.head_dim * s.head_dim >= PARALLEL_WORK;
        recurrence_phase(&inputs, n, rows, &mut o, s, parallel)?;
        for (i, out) in o.chunks_mut(p).enumerate() {
            gated_norm(
                out,
                &proj.gate[i * p..(i + 1) * p],
                self.o_norm,
                self.eps,
                self.gate,
            );
        }
        Ok(o)
    }

    /// Per row, in order: the convolution (advancing each sequence's history), SiLU, the L2
    /// norms and q scale, the decay `g` and `β`; each row's recurrence inputs are recorded in its
    /// sequence's cache.
    fn channel_phase(&self, proj: &Projections, n: usize, rows: &mut KdaRows<'_, '_>) -> RowInputs {
        let s = self.shape;
        let (p, heads) = (s.channels(), s.heads);
        let mut inp = RowInputs {
            q: vec![0.0; n * p],
            k: vec![0.0; n * p],
            v: vec![0.0; n * p],
            g: vec![0.0; n * p],
            beta: vec![0.0; n * heads],
        };
        let mut record = vec![0.0f32; s.record_len()];
        math::fma_scope(|| self.channel_rows(proj, n, rows, &mut inp, &mut record));
        inp
    }

    /// The rows of [`DeltaCore::channel_phase`], in order.
    #[inline(always)]
    fn channel_rows(
        &self,
        proj: &Projections,
        n: usize,
        rows: &mut KdaRows<'_, '_>,
        inp: &mut RowInputs,
        record: &mut [f32],
    ) {
        let s = self.shape;
        let (p, heads, hd) = (s.channels(), s.heads, s.head_dim);
        for i in 0..n {
            let cache = &mut *rows.caches[rows.seq[i]];
            cache.begin_rows();
            let raw = &proj.qkv[i * 3 * p..(i + 1) * 3 * p];
            let (rec_raw, rest) = record.split_at_mut(3 * p);
            rec_raw.copy_from_slice(raw);
            let (k, rest) = rest.split_at_mut(p);
            let (v, rest) = rest.split_at_mut(p);
            let (g, beta) = rest.split_at_mut(p);
            let q = &mut inp.q[i * p..(i + 1) * p];
            convolve(self.conv, s, cache.conv_history(), raw, [q, k, v]);
            conv_push(cache.conv_history_mut(), raw, s);
            for h in 0..heads {
                let qh = &mut q[h * hd..(h + 1) * hd];
                self.l2.apply(qh);
                qh.iter_mut().for_each(|x| *x *= self.q_scale);
                self.l2.apply(&mut k[h * hd..(h + 1) * hd]);
            }
            let f = &proj.f[i * p..(i + 1) * p];
            for ((g, &f), &rate) in g.iter_mut().zip(f).zip(self.decay_rate) {
                *g = log_decay(self.decay, rate, f);
            }
            for (b, &logit) in beta.iter_mut().zip(&proj.beta[i * heads..(i + 1) * heads]) {
                *b = sigmoid(logit);
            }
            inp.k[i * p..(i + 1) * p].copy_from_slice(k);
            inp.v[i * p..(i + 1) * p].copy_from_slice(v);
            inp.g[i * p..(i + 1) * p].copy_from_slice(g);
            inp.beta[i * heads..(i + 1) * heads].copy_from_slice(beta);
            cache.record(record);
        }
    }
}

/// Causal depthwise convolution of one row (the `K − 1` history rows, then the current raw
/// values, each `acc += x·w` in order), then SiLU, into the `[q, k, v]` outputs (`P` each).
/// `conv` is `[3P, K]`.
#[inline(always)]
pub fn convolve(conv: &[f32], shape: KdaShape, history: &[f32], raw: &[f32], out: [&mut [f32]; 3]) {
    let p = shape.channels();
    let kernel = shape.kernel;
    let width = 3 * p;
    let [q, k, v] = out;
    for c in 0..width {
        let w = &conv[c * kernel..(c + 1) * kernel];
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

/// One channel's log-decay `g` from `f` (after `dt_bias`) and its rate `exp(A_log)`.
#[inline(always)]
pub fn log_decay(decay: KdaDecay, rate: f32, f: f32) -> f32 {
    match decay {
        KdaDecay::Softplus => -rate * math::softplus(f),
        KdaDecay::LowerBound(bound) => bound * sigmoid(rate * f),
    }
}

/// Per head of `o` (`o_norm.len()` values each): `o ← w ⊙ (o · rms_inv(o)) ⊙ act(gate)`.
pub fn gated_norm(o: &mut [f32], gate: &[f32], o_norm: &[f32], eps: f32, act: GateActivation) {
    let hd = o_norm.len();
    let act = match act {
        GateActivation::Sigmoid => sigmoid,
        GateActivation::Silu => silu,
    };
    math::fma_scope(|| {
        for (oh, gh) in o.chunks_mut(hd).zip(gate.chunks(hd)) {
            let inv = rms_inv(oh, eps);
            for ((v, &w), &g) in oh.iter_mut().zip(o_norm).zip(gh) {
                *v = (w * (*v * inv)) * act(g);
            }
        }
    })
}

/// `o = qᵀS` per head (sum over the key index in order).
pub fn readout(state: &[f32], q: &[f32], shape: KdaShape, out: &mut [f32]) {
    let d = shape.head_dim;
    for h in 0..shape.heads {
        head_readout(
            &state[h * d * d..(h + 1) * d * d],
            &q[h * d..(h + 1) * d],
            &mut out[h * d..(h + 1) * d],
            d,
        );
    }
}

/// One head's read-out `o = qᵀS` (sum over the key index in order).
pub(crate) fn head_readout(s: &[f32], q: &[f32], out: &mut [f32], d: usize) {
    out.iter_mut().for_each(|x| *x = 0.0);
    for (row, &qi) in s.chunks(d).zip(q) {
        for (acc, &x) in out.iter_mut().zip(row) {
            *acc += x * qi;
        }
    }
}

/// Every row's recurrence inputs (`[n, P]` each, `beta` `[n, heads]`).
struct RowInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

/// Below this many multiply-adds the recurrence runs on the calling thread (one decode row).
const PARALLEL_WORK: usize = 1 << 16;

/// One `(sequence, head)` recurrence of a pass: that head's state (and, for the pass's first
/// step, the pre-pass state to read out of place) and the sequence's rows in order.
struct HeadTask<'a> {
    head: usize,
    prev: Option<&'a [f32]>,
    state: &'a mut [f32],
    rows: &'a [usize],
}

/// The delta rule and read-out of every row, per `(sequence, head)`; writes `o`.
/// `parallel`: spread the tasks over the thread pool (the bits do not depend on it).
fn recurrence_phase(
    inp: &RowInputs,
    n: usize,
    rows: &mut KdaRows<'_, '_>,
    o: &mut [f32],
    s: KdaShape,
    parallel: bool,
) -> Result<()> {
    let (p, heads, d) = (s.channels(), s.heads, s.head_dim);
    let mut by_seq: Vec<Vec<usize>> = vec![Vec::new(); rows.caches.len()];
    for (i, &seq) in rows.seq.iter().enumerate().take(n) {
        by_seq[seq].push(i);
    }
    if let Some(elsewhere) = rows.elsewhere.as_deref_mut() {
        for (cache, seq_rows) in rows.caches.iter_mut().zip(by_seq.iter_mut()) {
            if seq_rows.is_empty() || !elsewhere.takes(seq_rows.len()) {
                continue;
            }
            let out = seq_elsewhere(elsewhere, inp, (seq_rows, s), cache)?;
            for (j, &i) in seq_rows.iter().enumerate() {
                o[i * p..(i + 1) * p].copy_from_slice(&out[j * p..(j + 1) * p]);
            }
            cache.pass_steps_done();
            seq_rows.clear();
        }
    }
    let mut tasks: Vec<HeadTask<'_>> = Vec::with_capacity(rows.caches.len() * heads);
    for (cache, seq_rows) in rows.caches.iter_mut().zip(&by_seq) {
        if seq_rows.is_empty() {
            continue;
        }
        let (prev, live) = cache.pass_states();
        for (head, state) in live.chunks_mut(d * d).enumerate() {
            let prev = prev.map(|p| &p[head * d * d..(head + 1) * d * d]);
            tasks.push(HeadTask {
                head,
                prev,
                state,
                rows: seq_rows,
            });
        }
    }
    let run_head = |t: HeadTask<'_>| -> (usize, Vec<f32>) {
        let mut out = vec![0.0f32; t.rows.len() * d];
        let mut delta = vec![0.0f32; d];
        let c = t.head * d..(t.head + 1) * d;
        for (j, &i) in t.rows.iter().enumerate() {
            let prev = if j == 0 { t.prev } else { None };
            let ch = i * p + c.start..i * p + c.end;
            let khv = (&inp.k[ch.clone()], &inp.v[ch.clone()], &inp.g[ch.clone()]);
            head_step_with(prev, t.state, khv, inp.beta[i * heads + t.head], &mut delta);
            head_readout(t.state, &inp.q[ch], &mut out[j * d..(j + 1) * d], d);
        }
        (t.head, out)
    };
    let run = |t: HeadTask<'_>| math::fma_scope(|| run_head(t));
    let outs: Vec<(usize, Vec<f32>)> = if parallel && rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        tasks.into_par_iter().map(run).collect()
    } else {
        tasks.into_iter().map(run).collect()
    };
    // Tasks were made per sequence, heads in order: scatter each back to its rows.
    let mut outs = outs.into_iter();
    for seq_rows in by_seq.iter().filter(|r| !r.is_empty()) {
        for _ in 0..heads {
            let (head, out) = outs.next().expect("one output per (sequence, head) task");
            for (j, &i) in seq_rows.iter().enumerate() {
                o[i * p + head * d..i * p + (head + 1) * d].copy_from_slice(&out[j * d..(j + 1) * d]);
            }
        }
    }
    for (cache, seq_rows) in rows.caches.iter_mut().zip(&by_seq) {
        if !seq_rows.is_empty() {
            cache.pass_steps_done();
        }
    }
    Ok(())
}

/// One sequence's rows (`rows`, in order) through `elsewhere`, its state from the cache's
/// pre-pass matrix (or live buffer) into the live buffer; the rows' read-outs.
fn seq_elsewhere(
    elsewhere: &mut dyn SeqRecurrence,
    inp: &RowInputs,
    (rows, s): (&[usize], KdaShape),
    cache: &mut KdaCache,
) -> Result<Vec<f32>> {
    let (p, heads) = (s.channels(), s.heads);
    let mut qkv = Vec::with_capacity(rows.len() * 3 * p);
    for &i in rows {
        for part in [&inp.q, &inp.k, &inp.v] {
            qkv.extend_from_slice(&part[i * p..(i + 1) * p]);
        }
    }
    let g: Vec<f32> = rows
        .iter()
        .flat_map(|&i| inp.g[i * p..(i + 1) * p].iter().copied())
        .collect();
    let beta: Vec<f32> = rows
        .iter()
        .flat_map(|&i| inp.beta[i * heads..(i + 1) * heads].iter().copied())
        .collect();
    let state = cache.pass_states();
    let seq = SeqRows {
        qkv: &qkv,
        g: &g,
        beta: &beta,
        rows: rows.len(),
    };
    elsewhere.run(seq, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_broadcasts_by_stored_shape() {
        let per_head = broadcast_decay_rate(&[1, 1, 2, 1], &[0.0, 1.0], 2, 3).unwrap();
        assert_eq!(per_head, vec![1.0, 1.0, 1.0, exp(1.0), exp(1.0), exp(1.0)]);
        let per_channel = broadcast_decay_rate(&[3], &[0.0, 1.0, 2.0], 2, 3).unwrap();
        assert_eq!(per_channel[..3], per_channel[3..]);
        assert_eq!(per_channel[2], exp(2.0));
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

    /// The head-split recurrence (parallel or not, two sequences interleaved in one pass, the
    /// first step read out of place) gives the bits of the scalar twin: every row stepped with
    /// [`delta_rule_step`] and read out with [`readout`], one sequence at a time.
    #[test]
    fn the_head_split_recurrence_matches_the_row_by_row_twin() {
        let s = KdaShape {
            heads: 3,
            head_dim: 8,
            kernel: 2,
        };
        let (p, n) = (s.channels(), 7);
        let mut rng = crate::synth::Rng::new(9);
        let mut vals =
            |len: usize, scale: f32| -> Vec<f32> { (0..len).map(|_| rng.symmetric(scale)).collect() };
        let inp = RowInputs {
            q: vals(n * p, 0.5),
            k: vals(n * p, 0.3),
            v: vals(n * p, 1.0),
            g: vals(n * p, 0.2).into_iter().map(|x| -x.abs()).collect(),
            beta: vals(n * s.heads, 1.0).into_iter().map(sigmoid).collect(),
        };
        let seq = [0, 1, 0, 0, 1, 0, 1];
        let start = [vals(s.state_len(), 0.1), vals(s.state_len(), 0.1)];
        // The twin: each sequence's rows in order, whole-state steps.
        let mut want = vec![0.0f32; n * p];
        for (which, init) in start.iter().enumerate() {
            let mut state = init.clone();
            for i in (0..n).filter(|&i| seq[i] == which) {
                let c = i * p..(i + 1) * p;
                let x = StepInputs {
                    k: &inp.k[c.clone()],
                    v: &inp.v[c.clone()],
                    g: &inp.g[c.clone()],
                    beta: &inp.beta[i * s.heads..(i + 1) * s.heads],
                };
                delta_rule_step(&mut state, x, s);
                readout(&state, &inp.q[c.clone()], s, &mut want[c]);
            }
        }
        for parallel in [false, true] {
            let mut caches: Vec<KdaCache> = start
                .iter()
                .map(|init| {
                    let mut c = KdaCache::new(s);
                    c.restore_for_test(init);
                    c.begin_rows();
                    c
                })
                .collect();
            let mut refs: Vec<&mut KdaCache> = caches.iter_mut().collect();
            let mut rows = KdaRows {
                caches: &mut refs,
                seq: &seq,
                elsewhere: None,
            };
            let mut got = vec![0.0f32; n * p];
            recurrence_phase(&inp, n, &mut rows, &mut got, s, parallel).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "parallel: {parallel}");
        }
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
