//! DeepSeek-V4's attention core on a device, around the host part of the layer
//! (`CompressedAttention::prepare`: RoPE, the caches, entries pooled as windows close). The
//! host cache stays the state of record; the device keeps the indexer's keys and the compressed
//! entries of each sequence in pools (per slot in the server, mirrored from the host state;
//! per session), written as windows close:
//! * the indexer's choice ([`v4_choose`]): scores in V4's order and their top-k on the device
//!   (`device_index::top_keys`);
//! * the attention ([`v4_attend`], `deltafin_v4_attend`): each row's window keys (gathered from
//!   the host's window, which holds only the last `window` positions) and its chosen entries
//!   from the pool, with the sink, in the CPU's order; then the heads' RoPE undone
//!   (`deltafin_rope` on pairs in place, sines negated). The heads stay on the device for the
//!   output projection.

use super::compressed::{
    CompressedAttention, CompressedProjected, CompressedRows, IndexRows, Prepared, V4IndexerDims,
};
use super::device_index::{ScoreOrder, ScoredRows, top_keys};
use crate::backend::abi::{self, RopeLayout};
use crate::backend::device::DeviceOps;
use crate::error::Result;
use crate::state::{CompressedCache, Paged};

/// Per-window rows of each sequence on a device (the indexer's keys, or the entries): sequence
/// `s`'s rows from row `base[s]` of `rows`, the first `held[s]` of them written already.
#[derive(Debug)]
pub struct V4Pool<'a, B> {
    pub rows: &'a B,
    pub base: &'a [usize],
    pub held: &'a [usize],
}

/// A V4 layer's pools on a device for one pass (`None`: the layer has no such rows), and the
/// positions per window.
#[derive(Debug)]
pub struct V4Pools<'a, B> {
    pub keys: Option<V4Pool<'a, B>>,
    pub entries: Option<V4Pool<'a, B>>,
    pub ratio: usize,
}

/// Write the rows `part` of each sequence's cache holds past what `pool` holds.
fn write_new<D: DeviceOps>(
    dev: &D,
    pool: &V4Pool<'_, D::Buf>,
    caches: &[&mut CompressedCache],
    part: fn(&CompressedCache) -> &Paged,
) -> Result<()> {
    for (s, cache) in caches.iter().enumerate() {
        let rows = part(cache);
        let (from, to) = (pool.held[s], rows.len());
        if from < to {
            let new: Vec<f32> = (from..to).flat_map(|e| rows.row(e).iter().copied()).collect();
            let at: Vec<usize> = (from..to).map(|e| pool.base[s] + e).collect();
            super::device::write_rows(dev, &new, rows.width(), (pool.rows, &at))?;
        }
    }
    Ok(())
}

/// The core of a V4 layer's pass on a device: the projections brought down, the host part
/// (with the indexer's choice on the device where the layer has one), the pass's new entries
/// written to the pool, and the attention on the device. The heads' outputs, on the device.
pub fn v4_core<D: DeviceOps>(
    dev: &D,
    c: &CompressedAttention,
    (p, n): (CompressedProjected<D::Buf>, usize),
    rows: &mut CompressedRows<'_, '_>,
    pools: V4Pools<'_, D::Buf>,
) -> Result<D::Buf> {
    let p = p.map(|b| dev.download_f32(&b))?;
    let prepared = match (&pools.keys, &c.indexer) {
        (Some(keys), Some(ix)) => {
            let mut choose = |r: IndexRows<'_, '_>| v4_choose(dev, ix.dims, (keys, pools.ratio), r);
            c.prepare(p, n, rows, Some(&mut choose))?
        }
        _ => c.prepare(p, n, rows, None)?,
    };
    if let Some(entries) = &pools.entries {
        write_new(dev, entries, rows.caches, |c| &c.entries)?;
    }
    v4_attend(dev, c, &prepared, rows, pools.entries.as_ref())
}

/// DeepSeek-V4's choice of compressed entries on a device for a pass's sparse rows (a
/// `compressed::IndexChoose`): the keys the pass closed written to the pool, then
/// [`top_keys`] in V4's order over each row's closed entries.
pub fn v4_choose<D: DeviceOps>(
    dev: &D,
    dims: V4IndexerDims,
    (pool, ratio): (&V4Pool<'_, D::Buf>, usize),
    rows: IndexRows<'_, '_>,
) -> Result<Vec<Vec<usize>>> {
    write_new(dev, pool, rows.caches, |c| &c.index_keys)?;
    let (h, d, ratio) = (dims.heads, dims.head_dim, ratio.max(1));
    let spans: Vec<(usize, usize)> = rows
        .sparse
        .iter()
        .map(|&r| (pool.base[rows.seq[r]], (rows.pos[r] + 1) / ratio))
        .collect();
    let scored = ScoredRows {
        rows: rows.sparse,
        spans: &spans,
        q: rows.q,
        w: rows.w,
    };
    let chosen = top_keys(dev, pool.rows, (h, d, dims.top_k), scored, ScoreOrder::V4)?;
    Ok(chosen
        .into_iter()
        .map(|c| c.into_iter().map(|e| e as usize).collect())
        .collect())
}

/// The window keys of a pass's rows, gathered per sequence from the host caches (each
/// sequence's rows see one run of positions), and each row's first gathered row and count.
fn windows(c: &CompressedAttention, rows: &CompressedRows<'_, '_>) -> (Vec<f32>, Vec<(usize, usize)>) {
    let window = c.dims.window.max(1);
    let seen = |pos: usize| ((pos + 1).saturating_sub(window), pos + 1);
    let mut span = vec![(usize::MAX, 0usize); rows.caches.len()];
    for (&s, &pos) in rows.seq.iter().zip(rows.pos) {
        let (lo, hi) = seen(pos);
        span[s] = (span[s].0.min(lo), span[s].1.max(hi));
    }
    let mut keys = Vec::new();
    let mut first = vec![0usize; span.len()];
    for (s, &(lo, hi)) in span.iter().enumerate() {
        first[s] = keys.len() / c.dims.head_dim.max(1);
        for j in lo..hi.max(lo) {
            keys.extend_from_slice(rows.caches[s].kv.row(j));
        }
    }
    let per_row = rows
        .seq
        .iter()
        .zip(rows.pos)
        .map(|(&s, &pos)| {
            let (lo, hi) = seen(pos);
            (first[s] + lo - span[s].0, hi - lo)
        })
        .collect();
    (keys, per_row)
}

/// The attention of a pass's prepared rows on the device (`deltafin_v4_attend`), then the
/// heads' RoPE undone; the heads' outputs `[n, heads·head_dim]` on the device.
fn v4_attend<D: DeviceOps>(
    dev: &D,
    c: &CompressedAttention,
    prepared: &Prepared,
    rows: &CompressedRows<'_, '_>,
    entries: Option<&V4Pool<'_, D::Buf>>,
) -> Result<D::Buf> {
    let (d, n) = (c.dims, rows.pos.len());
    let hd = d.head_dim;
    let (window, spans) = windows(c, rows);
    let (mut info, mut chosen) = (Vec::with_capacity(4 * n), Vec::new());
    for (r, &(first, count)) in spans.iter().enumerate() {
        let selected = &prepared.selected[r];
        info.extend([first, count, chosen.len(), selected.len()].map(|v| v as i32));
        let base = entries.map_or(0, |e| e.base[rows.seq[r]]);
        chosen.extend(selected.iter().map(|&e| (base + e) as i32));
    }
    let (q, window) = (dev.upload_f32(&prepared.q)?, dev.upload_f32(&window)?);
    let (info, chosen) = (dev.upload_i32(&info)?, dev.upload_i32(&chosen)?);
    let sinks = dev.upload_f32(&c.sinks)?;
    let out = dev.zeros_f32(n * d.heads * hd)?;
    let launch = abi::v4_attend(n, d.heads, hd, (hd as f32).powf(-0.5))?;
    let pool = entries.map(|e| e.rows).unwrap_or(&window);
    let bufs = [
        Some(&q),
        Some(&window),
        Some(pool),
        Some(&info),
        Some(&chosen),
        Some(&sinks),
        Some(&out),
    ];
    dev.layer(&launch, &bufs)?;
    // Back by each row's position: the factors' sines negated.
    let mut f = vec![0.0f32; n * d.rope];
    for (row, &pos) in f.chunks_mut(d.rope.max(1)).zip(rows.pos) {
        c.rope.factors_into(pos, row);
        row.iter_mut().skip(1).step_by(2).for_each(|s| *s = -*s);
    }
    let at = RopeLayout {
        vecs: d.heads,
        row_stride: d.heads * hd,
        offset: hd - d.rope,
        vec_stride: hd,
    };
    let f = dev.upload_f32(&f)?;
    dev.layer(&abi::rope_pairs(n, at, d.rope)?, &[Some(&out), Some(&f)])?;
    Ok(out)
}
