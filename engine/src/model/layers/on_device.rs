//! The op trait on a device ([`OnDevice`]: any [`DeviceOps`] as the layers' [`Ops`]): every
//! operation a kernel of `backend/cuda/layers.cu` whose bits equal the CPU's, buffers in device
//! memory. The layers written once over [`Ops`] (`Mlp::run`, `Moe::run`, `Mla::run`,
//! `Kda::run`, the decoder's loops) run on a GPU, or on the CPU emulator of the kernel sources in
//! CI, through it. The routed experts' dispatch ([`Ops::routed`]) is the device's own schedule:
//! each chosen expert gathered, run and scattered; out of core, straight from the expert store's
//! host cache slots into the device tier.

use std::borrow::Cow;

use super::hyper::{HyperHead, HyperSite};
use super::mlp::{Activation, Mlp};
use super::moe::{ExpertProvider, Moe};
use super::ops::{Cols, Ops, Routes};
use super::rope::Rope;
use crate::backend::WeightClass;
use crate::backend::abi::{self, RopeLayout, RowSlice};
use crate::backend::device::DeviceOps;
use crate::error::Result;
use crate::kernels::Matrix;

/// `y = W x` into a new buffer.
fn project<D: DeviceOps>(dev: &D, m: &Matrix, class: WeightClass, x: &D::Buf, n: usize) -> Result<D::Buf> {
    let y = dev.zeros_f32(n * m.rows)?;
    dev.matmul(m, class, x, n, &y)?;
    Ok(y)
}

/// RMSNorm of `rows` rows of `weight.len()` into a new buffer (`weight` on the device).
pub(super) fn rms_norm<D: DeviceOps>(
    dev: &D,
    x: &D::Buf,
    weight: &D::Buf,
    rows: usize,
    width: usize,
    eps: f32,
) -> Result<D::Buf> {
    let out = dev.zeros_f32(rows * width)?;
    dev.layer(
        &abi::rms_norm(rows, width, eps),
        &[Some(x), Some(weight), Some(&out)],
    )?;
    Ok(out)
}

/// `a + b` over `count` values, into `a`'s place (a new buffer returned).
fn add<D: DeviceOps>(dev: &D, a: &D::Buf, b: &D::Buf, count: usize) -> Result<D::Buf> {
    let out = dev.zeros_f32(count)?;
    dev.layer(&abi::add(count), &[Some(a), Some(b), Some(&out)])?;
    Ok(out)
}

/// Copy rows (see [`abi::copy_rows`]); `src_rows`/`dst_rows`: row maps, `None` for 0...
pub fn copy_rows<D: DeviceOps>(
    dev: &D,
    (src, src_at, src_rows): (&D::Buf, RowSlice, Option<&D::Buf>),
    (dst, dst_at, dst_rows): (&D::Buf, RowSlice, Option<&D::Buf>),
    count: usize,
    width: usize,
) -> Result<()> {
    let l = abi::copy_rows(count, width, src_at, dst_at);
    dev.layer(&l, &[Some(src), Some(dst), src_rows, dst_rows])
}

/// A [`DeviceOps`] as the [`Ops`] layers are written against: every operation a kernel of
/// `backend/cuda/layers.cu` with the CPU kernel's bits.
#[derive(Debug)]
pub struct OnDevice<'d, D>(pub &'d D);

impl<D: DeviceOps> Ops for OnDevice<'_, D> {
    type Buf = D::Buf;

    fn input(&self, v: Vec<f32>) -> Result<D::Buf> {
        self.0.upload_f32(&v)
    }

    fn zeros(&self, count: usize) -> Result<D::Buf> {
        self.0.zeros_f32(count)
    }

    fn constant(&self, v: &[f32]) -> Result<D::Buf> {
        self.0.upload_f32(v)
    }

    fn host<'a>(&self, b: &'a D::Buf) -> Result<Cow<'a, [f32]>> {
        Ok(Cow::Owned(self.0.download_f32(b)?))
    }

    fn project(&self, m: &Matrix, class: WeightClass, x: &D::Buf, n: usize) -> Result<D::Buf> {
        project(self.0, m, class, x, n)
    }

    fn rms_norm(&self, x: &D::Buf, w: &D::Buf, rows: usize, width: usize, eps: f32) -> Result<D::Buf> {
        rms_norm(self.0, x, w, rows, width, eps)
    }

    fn rope(&self, x: D::Buf, n: usize, l: RopeLayout, rope: &Rope, pos: &[usize]) -> Result<D::Buf> {
        let dim = rope.dim();
        let mut f = vec![0.0f32; n * dim];
        for (row, &p) in f.chunks_mut(dim.max(1)).zip(pos) {
            rope.factors_into(p, row);
        }
        let f = self.0.upload_f32(&f)?;
        self.0
            .layer(&abi::rope(n, l, dim, rope.interleaved())?, &[Some(&x), Some(&f)])?;
        Ok(x)
    }

    fn mul_sigmoid(&self, a: D::Buf, g: &D::Buf, count: usize) -> Result<D::Buf> {
        self.0
            .layer(&abi::mul_sigmoid(count), &[Some(&a), Some(g), Some(&a)])?;
        Ok(a)
    }

    fn assemble(&self, n: usize, parts: &[(&D::Buf, Cols)]) -> Result<D::Buf> {
        let row: usize = parts.iter().map(|(_, (_, _, w))| w).sum();
        let out = self.0.zeros_f32(n * row)?;
        let mut at = 0;
        for &(b, (stride, col, width)) in parts {
            let (src, dst) = (RowSlice { stride, col }, RowSlice { stride: row, col: at });
            copy_rows(self.0, (b, src, None), (&out, dst, None), n, width)?;
            at += width;
        }
        Ok(out)
    }

    fn add(&self, a: &D::Buf, b: &D::Buf, count: usize) -> Result<D::Buf> {
        add(self.0, a, b, count)
    }

    fn add_rows(&self, x: D::Buf, bias: &[f32], rows: usize, width: usize) -> Result<D::Buf> {
        // The bias copied into every row (a row map of zeros), then the elementwise add.
        let dev = self.0;
        let (b, zeros) = (dev.upload_f32(bias)?, dev.zeros(4 * rows)?);
        let spread = dev.zeros_f32(rows * width)?;
        let dense = RowSlice {
            stride: width,
            col: 0,
        };
        copy_rows(
            dev,
            (&b, dense, Some(&zeros)),
            (&spread, dense, None),
            rows,
            width,
        )?;
        add(dev, &x, &spread, rows * width)
    }

    fn activate(&self, g: D::Buf, u: &D::Buf, act: Activation, count: usize) -> Result<D::Buf> {
        self.0
            .layer(&abi::gated_act(count, act)?, &[Some(&g), Some(u), Some(&g)])?;
        Ok(g)
    }

    fn gate_rows(&self, x: D::Buf, logits: &D::Buf, rows: usize, width: usize) -> Result<D::Buf> {
        // Each row's logit spread over its values (a row map), then `x · σ(logit)`.
        let dev = self.0;
        let map: Vec<i32> = (0..rows * width).map(|i| (i / width.max(1)) as i32).collect();
        let (map, spread) = (dev.upload_i32(&map)?, dev.zeros_f32(rows * width)?);
        let one = RowSlice { stride: 1, col: 0 };
        copy_rows(
            dev,
            (logits, one, Some(&map)),
            (&spread, one, None),
            rows * width,
            1,
        )?;
        let count = rows * width;
        dev.layer(&abi::mul_sigmoid(count), &[Some(&x), Some(&spread), Some(&x)])?;
        Ok(x)
    }

    fn put_slot(&self, stack: &mut D::Buf, slot: usize, v: &D::Buf, n: usize, h: usize) -> Result<()> {
        let src = RowSlice { stride: h, col: 0 };
        let dst = RowSlice {
            stride: h,
            col: slot * n * h,
        };
        copy_rows(self.0, (v, src, None), (stack, dst, None), n, h)
    }

    fn attn_res(
        &self,
        (query, eps): (&D::Buf, f32),
        stack: &D::Buf,
        count: usize,
        (n, h): (usize, usize),
    ) -> Result<D::Buf> {
        let out = self.0.zeros_f32(n * h)?;
        self.0.layer(
            &abi::attn_res(n, h, count, eps)?,
            &[Some(stack), Some(query), Some(&out)],
        )?;
        Ok(out)
    }

    fn hyper_site(
        &self,
        (site, proj): (&HyperSite, &D::Buf),
        streams: &D::Buf,
        (n, h): (usize, usize),
    ) -> Result<[D::Buf; 2]> {
        let (dev, m) = (self.0, site.mix_count());
        let mixes = dev.zeros_f32(n * m)?;
        let width = site.streams * h;
        let l = abi::hyper_mixes(n, width, m, site.norm_eps);
        dev.layer(&l, &[Some(streams), Some(proj), Some(&mixes)])?;
        let consts = dev.upload_f32(&[&site.base[..], &site.scale[..]].concat())?;
        let (weights, out) = (dev.zeros_f32(n * m)?, dev.zeros_f32(n * h)?);
        let l = abi::hyper_weights(n, (site.streams, h), (site.iters, false), site.hc_eps)?;
        let bufs = [
            Some(&mixes),
            Some(&consts),
            Some(streams),
            Some(&weights),
            Some(&out),
        ];
        dev.layer(&l, &bufs)?;
        Ok([weights, out])
    }

    fn hyper_expand(
        &self,
        weights: &D::Buf,
        y: &D::Buf,
        streams: D::Buf,
        (n, s, h): (usize, usize, usize),
    ) -> Result<D::Buf> {
        let out = self.0.zeros_f32(n * s * h)?;
        let bufs = [Some(weights), Some(y), Some(&streams), Some(&out)];
        self.0.layer(&abi::hyper_expand(n, s, h)?, &bufs)?;
        Ok(out)
    }

    fn hyper_head(
        &self,
        (head, proj): (&HyperHead, &D::Buf),
        streams: &D::Buf,
        (n, h): (usize, usize),
    ) -> Result<D::Buf> {
        let (dev, s) = (self.0, head.base.len());
        let mixes = dev.zeros_f32(n * s)?;
        dev.layer(
            &abi::hyper_mixes(n, s * h, s, head.norm_eps),
            &[Some(streams), Some(proj), Some(&mixes)],
        )?;
        let consts = dev.upload_f32(&[&head.base[..], &[head.scale]].concat())?;
        let out = dev.zeros_f32(n * h)?;
        let l = abi::hyper_weights(n, (s, h), (0, true), head.hc_eps)?;
        dev.layer(
            &l,
            &[Some(&mixes), Some(&consts), Some(streams), None, Some(&out)],
        )?;
        Ok(out)
    }

    fn route(&self, m: &Moe, logits: D::Buf, n: usize, tokens: Option<&[u32]>) -> Result<Routes> {
        if m.hash.is_some() || !abi::routes_on_device(&m.router) {
            // Hash routing (the rows' token ids) and scores the router kernel has no form of:
            // the logits (a few KB) come down and the CPU's router takes them.
            return m.routes_of(self.0.download_f32(&logits)?, n, tokens);
        }
        route(self, m, logits, n)
    }

    fn routed(
        &self,
        m: &Moe,
        experts: Option<&dyn ExpertProvider>,
        input: &D::Buf,
        width: usize,
        routes: &[Vec<(usize, f32)>],
    ) -> Result<D::Buf> {
        routed(self, (m, experts), input, width, routes)
    }
}

/// The router kernel's routes (router order) of `n` rows' `logits` (the router's own logit
/// bias added first, as the CPU does).
fn route<D: DeviceOps>(o: &OnDevice<'_, D>, m: &Moe, logits: D::Buf, n: usize) -> Result<Routes> {
    let (dev, e, r) = (o.0, m.gate.rows, &m.router);
    let logits = match m.logit_bias.is_empty() {
        true => logits,
        false => o.add_rows(logits, &m.logit_bias, n, e)?,
    };
    let (ids, weights) = (dev.zeros(4 * n * r.top_k)?, dev.zeros_f32(n * r.top_k)?);
    let scratch = dev.zeros_f32(abi::route_scratch(n, e, r.n_group))?;
    let bias = match m.bias.is_empty() {
        true => None,
        false => Some(dev.upload_f32(&m.bias)?),
    };
    let bufs = [
        Some(&logits),
        bias.as_ref(),
        Some(&ids),
        Some(&weights),
        Some(&scratch),
    ];
    dev.layer(&abi::route(n, e, r)?, &bufs)?;
    let ids: Vec<i32> = dev
        .download(&ids)?
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let weights = dev.download_f32(&weights)?;
    Ok((0..n)
        .map(|row| {
            (0..r.top_k)
                .filter(|&t| ids[row * r.top_k + t] >= 0)
                .map(|t| (ids[row * r.top_k + t] as usize, weights[row * r.top_k + t]))
                .collect()
        })
        .collect())
}

/// `Σ w·expert(input)` per row in each route's order: every chosen expert once over the rows
/// that chose it (gathered), its outputs scattered to their route slots, then the combine.
fn routed<D: DeviceOps>(
    o: &OnDevice<'_, D>,
    (m, experts): (&Moe, Option<&dyn ExpertProvider>),
    input: &D::Buf,
    width: usize,
    routes: &[Vec<(usize, f32)>],
) -> Result<D::Buf> {
    let (dev, n) = (o.0, routes.len());
    let mut users: Vec<Vec<(i32, i32)>> = vec![Vec::new(); m.gate.rows];
    let mut offsets = vec![0i32];
    for (row, route) in routes.iter().enumerate() {
        let base = *offsets.last().expect("starts at 0");
        for (slot, &(expert, _)) in route.iter().enumerate() {
            users[expert].push((row as i32, base + slot as i32));
        }
        offsets.push(base + route.len() as i32);
    }
    let slots = *offsets.last().expect("one offset per row") as usize;
    let results = dev.zeros_f32(slots * width)?;
    let rows = RowSlice {
        stride: width,
        col: 0,
    };
    let chosen: Vec<usize> = (0..users.len()).filter(|&e| !users[e].is_empty()).collect();
    // One expert over the rows that chose it: gathered, run, scattered to their route slots
    // (disjoint per expert, so experts may run in any order, on any thread).
    let run = |expert: usize, weights: &Mlp| -> Result<()> {
        let (who, k) = (&users[expert], users[expert].len());
        let src = dev.upload_i32(&who.iter().map(|w| w.0).collect::<Vec<_>>())?;
        let dst = dev.upload_i32(&who.iter().map(|w| w.1).collect::<Vec<_>>())?;
        let gathered = dev.zeros_f32(k * width)?;
        copy_rows(dev, (input, rows, Some(&src)), (&gathered, rows, None), k, width)?;
        let y = weights.run(o, WeightClass::Expert, &gathered, k)?;
        copy_rows(dev, (&y, rows, None), (&results, rows, Some(&dst)), k, width)
    };
    match experts {
        None => chosen.iter().try_for_each(|&e| run(e, &m.experts[e]))?,
        Some(p) => served(p, &chosen, &run)?,
    }
    let weights: Vec<f32> = routes.iter().flatten().map(|&(_, w)| w).collect();
    let (w, off) = (dev.upload_f32(&weights)?, dev.upload_i32(&offsets)?);
    let out = dev.zeros_f32(n * width)?;
    dev.layer(
        &abi::combine(n, width),
        &[Some(&results), Some(&w), Some(&off), Some(&out)],
    )?;
    Ok(out)
}

/// Out of core: `run` over each expert of `ids` as the provider hands it over, from a host cache
/// slot it holds for the call (hits first, misses as their reads land, on its threads). The
/// products upload its bytes to the device tier unless the device holds them already: an
/// expert's blobs keep one key however often the host cache reads it again
/// ([`crate::weights::Blob::identified`]), so a routed expert resident in VRAM is no PCIe copy.
/// The first failure is the result.
fn served(
    p: &dyn ExpertProvider,
    ids: &[usize],
    run: &(dyn Fn(usize, &Mlp) -> Result<()> + Sync),
) -> Result<()> {
    let failed = std::sync::Mutex::new(None);
    p.for_each_expert(ids, &|id, e| {
        if let Err(err) = run(id, e) {
            failed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .get_or_insert(err);
        }
    })?;
    match failed
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
    {
        Some(err) => Err(err),
        None => Ok(()),
    }
}
