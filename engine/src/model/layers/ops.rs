//! The operations layers are written against, once for every device ([`Ops`]): matrix products
//! over the stored formats, RMSNorm, residual and bias adds, the gated activations, sigmoid row
//! gates, DeepSeek-V4's hyper-connection sites, routing and the routed experts' dispatch. A
//! layer written as a sequence of these runs on the CPU ([`Host`]: buffers are `Vec<f32>`, each
//! operation today's CPU kernel) and on a device (`on_device::OnDevice`: buffers stay in device
//! memory, each operation a kernel of `backend/cuda/layers.cu` whose bits equal the CPU
//! kernel's), so the two cannot drift: the gated MLP, the routed MoE and the projections, norms,
//! RoPE and gates of GQA, MLA, KDA, gated DeltaNet and DeepSeek-V4's attention exist once
//! (`Mlp::run`, `Moe::run`, `Gqa::run`, `Mla::run`, `Kda::run`, `GatedDeltaNet::run`,
//! `CompressedAttention::run`), as do the decoder's layer loops over them
//! (`arch/decoder/stack.rs`).
//!
//! What stays per device is only what the hardware schedules differently: how the chosen
//! experts are dispatched ([`Ops::routed`]: the CPU runs them in parallel as the expert store
//! hands them out; a device gathers, runs and scatters them a group at a time) and the
//! attention cores of the mixers.

use std::borrow::Cow;

use super::attn_res;
use super::hyper::{self, HyperHead, HyperSite};
use super::mlp::Activation;
use super::moe::{ExpertProvider, Moe};
use super::rope::Rope;
use crate::backend::abi::RopeLayout;
use crate::backend::{WeightClass, matmul, matmul_expert};
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::ops::{rms_norm_rows, sigmoid};

/// Columns of a buffer's rows: `(stride, col, width)`, the columns `col..col + width` of rows
/// of `stride` values.
pub type Cols = (usize, usize, usize);

/// A routed MoE's choices: per row, `(expert, weight)` in the order they are summed.
pub type Routes = Vec<Vec<(usize, f32)>>;

/// The operations a layer runs, on the device that holds its buffers.
pub trait Ops {
    /// `f32` values on the device (rows are `width` values each, row-major).
    type Buf;

    /// Host values onto the device.
    fn input(&self, v: Vec<f32>) -> Result<Self::Buf>;

    /// `count` zeros on the device.
    fn zeros(&self, count: usize) -> Result<Self::Buf>;

    /// A small constant (norm weight, bias) onto the device for one use.
    fn constant(&self, v: &[f32]) -> Result<Self::Buf>;

    /// The buffer's values on the host (borrowed where they already are).
    fn host<'a>(&self, b: &'a Self::Buf) -> Result<Cow<'a, [f32]>>;

    /// `y = W x` over `n` rows (the weights kept as `class` on a device).
    fn project(&self, m: &Matrix, class: WeightClass, x: &Self::Buf, n: usize) -> Result<Self::Buf>;

    /// RMSNorm of `rows` rows of `width` values (`weight` holds `width`).
    fn rms_norm(
        &self,
        x: &Self::Buf,
        weight: &Self::Buf,
        rows: usize,
        width: usize,
        eps: f32,
    ) -> Result<Self::Buf>;

    /// `n` rows, each the concatenation of one column slice per part: part `(b, (stride, col,
    /// width))` contributes columns `col..col + width` of `b`'s row (`b` holds `n` rows of
    /// `stride` values).
    fn assemble(&self, n: usize, parts: &[(&Self::Buf, Cols)]) -> Result<Self::Buf>;

    /// `x` (`n` rows) with the vectors `layout` places in each row rotated by `rope` for the
    /// row's position `pos[i]` (the factors computed on the host: `Rope::factors_into`).
    fn rope(
        &self,
        x: Self::Buf,
        n: usize,
        layout: RopeLayout,
        rope: &Rope,
        pos: &[usize],
    ) -> Result<Self::Buf>;

    /// `a · σ(g)` elementwise over `count` values.
    fn mul_sigmoid(&self, a: Self::Buf, g: &Self::Buf, count: usize) -> Result<Self::Buf>;

    /// `a + b` elementwise over `count` values.
    fn add(&self, a: &Self::Buf, b: &Self::Buf, count: usize) -> Result<Self::Buf>;

    /// `x` with `bias` (`width` values) added to each of its `rows` rows.
    fn add_rows(&self, x: Self::Buf, bias: &[f32], rows: usize, width: usize) -> Result<Self::Buf>;

    /// `g ← act(g, u)` over `count` values.
    fn activate(&self, g: Self::Buf, u: &Self::Buf, act: Activation, count: usize) -> Result<Self::Buf>;

    /// Each of `rows` rows of `x` (`width` values) times `sigmoid` of its row's logit.
    fn gate_rows(&self, x: Self::Buf, logits: &Self::Buf, rows: usize, width: usize) -> Result<Self::Buf>;

    /// Put `n` rows of `h` values into slot `slot` of a stack of `[slots, n, h]` values.
    fn put_slot(&self, stack: &mut Self::Buf, slot: usize, v: &Self::Buf, n: usize, h: usize) -> Result<()>;

    /// K3's Block Attention Residual mix of `n` rows over the first `count` slots of `stack`
    /// (the anchors, then the partial sum), by the site's pseudo-`query` (see `AttnRes::mix`).
    fn attn_res(
        &self,
        site: (&Self::Buf, f32),
        stack: &Self::Buf,
        count: usize,
        rows: (usize, usize),
    ) -> Result<Self::Buf>;

    /// DeepSeek-V4's hyper-connection site (`layers::hyper`) over `n` rows of its streams (`S·h`
    /// values each, stream-major): each row's flat mixing weights (`HyperWeights`) and its
    /// collapsed sub-layer input (`n × h`); `proj` is the site's projection on this device.
    fn hyper_site(
        &self,
        site: (&HyperSite, &Self::Buf),
        streams: &Self::Buf,
        rows: (usize, usize),
    ) -> Result<[Self::Buf; 2]>;

    /// `x'_k = post_k · y + Σ_j comb[j][k] · x_j` over `n` rows of `S` streams of `h` values:
    /// `weights` from [`Ops::hyper_site`], `y` the sub-layer's output.
    fn hyper_expand(
        &self,
        weights: &Self::Buf,
        y: &Self::Buf,
        streams: Self::Buf,
        dims: (usize, usize, usize),
    ) -> Result<Self::Buf>;

    /// The hyper head's collapse of `n` rows of streams into `n × h` (`proj` on this device).
    fn hyper_head(
        &self,
        head: (&HyperHead, &Self::Buf),
        streams: &Self::Buf,
        rows: (usize, usize),
    ) -> Result<Self::Buf>;

    /// The routes of `n` rows from their router logits (`tokens`: the rows' ids, which a
    /// hash-routed layer needs), in the router's order.
    fn route(&self, moe: &Moe, logits: Self::Buf, n: usize, tokens: Option<&[u32]>) -> Result<Routes>;

    /// `Σ w·expert(input)` per row (`width` values), summed in each route's order; every chosen
    /// expert runs once over the rows that chose it, its weights from `experts` (out of core)
    /// or the MoE's own.
    fn routed(
        &self,
        moe: &Moe,
        experts: Option<&dyn ExpertProvider>,
        input: &Self::Buf,
        width: usize,
        routes: &[Vec<(usize, f32)>],
    ) -> Result<Self::Buf>;
}

/// The CPU: buffers are host vectors, each operation the CPU kernel (products through
/// [`crate::backend::matmul`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Host;

impl Ops for Host {
    type Buf = Vec<f32>;

    fn input(&self, v: Vec<f32>) -> Result<Vec<f32>> {
        Ok(v)
    }

    fn zeros(&self, count: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; count])
    }

    fn constant(&self, v: &[f32]) -> Result<Vec<f32>> {
        Ok(v.to_vec())
    }

    fn host<'a>(&self, b: &'a Vec<f32>) -> Result<Cow<'a, [f32]>> {
        Ok(Cow::Borrowed(b))
    }

    fn project(&self, m: &Matrix, class: WeightClass, x: &Vec<f32>, n: usize) -> Result<Vec<f32>> {
        let mut y = vec![0.0f32; n * m.rows];
        match class {
            WeightClass::Spine => matmul(m, x, n, &mut y),
            WeightClass::Expert => matmul_expert(m, x, n, &mut y),
        }
        Ok(y)
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, _: usize, width: usize, eps: f32) -> Result<Vec<f32>> {
        Ok(rms_norm_rows(x, w, eps, width))
    }

    fn assemble(&self, n: usize, parts: &[(&Vec<f32>, Cols)]) -> Result<Vec<f32>> {
        let row: usize = parts.iter().map(|(_, (_, _, w))| w).sum();
        let mut out = Vec::with_capacity(n * row);
        for i in 0..n {
            for (b, (stride, col, width)) in parts {
                out.extend_from_slice(&b[i * stride + col..i * stride + col + width]);
            }
        }
        Ok(out)
    }

    fn rope(&self, mut x: Vec<f32>, n: usize, l: RopeLayout, rope: &Rope, pos: &[usize]) -> Result<Vec<f32>> {
        let dim = rope.dim();
        let mut f = vec![0.0f32; dim];
        for (i, &p) in pos.iter().enumerate().take(n) {
            rope.factors_into(p, &mut f);
            for v in 0..l.vecs {
                let at = i * l.row_stride + l.offset + v * l.vec_stride;
                rope.apply_factors(&mut x[at..at + dim], &f);
            }
        }
        Ok(x)
    }

    fn mul_sigmoid(&self, mut a: Vec<f32>, g: &Vec<f32>, _: usize) -> Result<Vec<f32>> {
        crate::kernels::math::fma_scope(|| a.iter_mut().zip(g).for_each(|(a, g)| *a *= sigmoid(*g)));
        Ok(a)
    }

    fn add(&self, a: &Vec<f32>, b: &Vec<f32>, _: usize) -> Result<Vec<f32>> {
        Ok(a.iter().zip(b).map(|(a, b)| a + b).collect())
    }

    fn add_rows(&self, mut x: Vec<f32>, bias: &[f32], _: usize, width: usize) -> Result<Vec<f32>> {
        for row in x.chunks_mut(width.max(1)) {
            row.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
        }
        Ok(x)
    }

    fn activate(&self, mut g: Vec<f32>, u: &Vec<f32>, act: Activation, _: usize) -> Result<Vec<f32>> {
        super::mlp::activate(act, &mut g, u);
        Ok(g)
    }

    fn gate_rows(&self, mut x: Vec<f32>, logits: &Vec<f32>, _: usize, width: usize) -> Result<Vec<f32>> {
        for (row, &l) in x.chunks_mut(width.max(1)).zip(logits) {
            let w = sigmoid(l);
            row.iter_mut().for_each(|v| *v *= w);
        }
        Ok(x)
    }

    fn put_slot(&self, stack: &mut Vec<f32>, slot: usize, v: &Vec<f32>, n: usize, h: usize) -> Result<()> {
        stack[slot * n * h..(slot + 1) * n * h].copy_from_slice(&v[..n * h]);
        Ok(())
    }

    fn attn_res(
        &self,
        (query, eps): (&Vec<f32>, f32),
        stack: &Vec<f32>,
        count: usize,
        (n, h): (usize, usize),
    ) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; n * h];
        let mut anchors: Vec<&[f32]> = Vec::with_capacity(count);
        for (r, o) in out.chunks_mut(h).enumerate() {
            let row = |slot: usize| &stack[(slot * n + r) * h..(slot * n + r + 1) * h];
            anchors.clear();
            anchors.extend((0..count - 1).map(row));
            attn_res::mix(query, eps, &anchors, row(count - 1), o);
        }
        Ok(out)
    }

    fn hyper_site(
        &self,
        (site, _): (&HyperSite, &Vec<f32>),
        x: &Vec<f32>,
        rows: (usize, usize),
    ) -> Result<[Vec<f32>; 2]> {
        let (w, u) = hyper::site_rows(site, x, rows);
        Ok([w, u])
    }

    fn hyper_expand(
        &self,
        w: &Vec<f32>,
        y: &Vec<f32>,
        mut x: Vec<f32>,
        (_, s, h): (usize, usize, usize),
    ) -> Result<Vec<f32>> {
        hyper::expand_rows(w, y, &mut x, (s, h));
        Ok(x)
    }

    fn hyper_head(
        &self,
        (head, _): (&HyperHead, &Vec<f32>),
        x: &Vec<f32>,
        rows: (usize, usize),
    ) -> Result<Vec<f32>> {
        Ok(head.rows(x, rows))
    }

    fn route(&self, moe: &Moe, logits: Vec<f32>, n: usize, tokens: Option<&[u32]>) -> Result<Routes> {
        moe.routes_of(logits, n, tokens)
    }

    fn routed(
        &self,
        moe: &Moe,
        experts: Option<&dyn ExpertProvider>,
        input: &Vec<f32>,
        width: usize,
        routes: &[Vec<(usize, f32)>],
    ) -> Result<Vec<f32>> {
        moe.routed_host(input, width, routes, experts.unwrap_or(&moe.experts))
    }
}
