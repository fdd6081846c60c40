//! The KDA recurrence's state transition, shared by the forward pass (`model::layers::kda`) and
//! the state's replay on a partial commit (`SeqState::commit`): one function for both, so a
//! replayed row is bit-identical to the row the pass ran. [`KdaShape`] is the state's shape.

use crate::kernels::math::exp;

/// Shape of a KDA layer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdaShape {
    pub heads: usize,
    /// Key and value width per head.
    pub head_dim: usize,
    /// Short-convolution width `K` (the history keeps `K - 1` rows).
    pub kernel: usize,
}

impl KdaShape {
    /// Channels of one of q/k/v (`heads * head_dim`).
    pub fn channels(self) -> usize {
        self.heads * self.head_dim
    }

    /// Floats of convolution history (`(K - 1)` rows of the `3P` raw projections).
    pub fn conv_len(self) -> usize {
        3 * self.channels() * self.kernel.saturating_sub(1)
    }

    /// Floats of the delta-rule state (`heads × head_dim × head_dim`).
    pub fn state_len(self) -> usize {
        self.heads * self.head_dim * self.head_dim
    }

    /// Floats recorded per staged row: raw q/k/v (3P), k, v, g (P each), β (heads).
    pub fn record_len(self) -> usize {
        6 * self.channels() + self.heads
    }
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
    for (h, s) in state.chunks_mut(d * d).enumerate().take(shape.heads) {
        let c = h * d..(h + 1) * d;
        let src = prev.map(|p| &p[h * d * d..(h + 1) * d * d]);
        head_step_with(src, s, (&k[c.clone()], &v[c.clone()], &g[c]), beta[h], &mut delta);
    }
}

/// One head's delta-rule step on its `[d, d]` state (see [`delta_rule_step`]; `prev`: read the
/// pre-step state out of place), with a scratch `delta` of `d` values.
#[inline(always)]
pub(crate) fn head_step_with(
    prev: Option<&[f32]>,
    s: &mut [f32],
    (kh, vh, gh): (&[f32], &[f32], &[f32]),
    beta: f32,
    delta: &mut [f32],
) {
    let d = delta.len();
    for (i, (row, &gi)) in s.chunks_mut(d).zip(gh).enumerate() {
        let decay = exp(gi);
        match prev {
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
        *dj = (vj - *dj) * beta;
    }
    for (row, &ki) in s.chunks_mut(d).zip(kh) {
        for (x, &dj) in row.iter_mut().zip(delta.iter()) {
            *x += ki * dj;
        }
    }
}
