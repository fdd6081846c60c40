//! The attention cores on a device, around the layers' written-once projections (`Gqa::run`,
//! `Mla::run`, `Kda::run` over [`OnDevice`]): grouped-query attention with its key/value cache,
//! absorbed MLA with its latent cache (rows appended, absorbed
//! queries, one block or every block then the ascending merge, the value projection) and KDA
//! with its recurrent state (convolution, L2 norms, gates, the delta rule, the gated norm), and
//! the last row's logits. Every activation stays in device buffers; each operation launches the
//! kernel whose bits equal the CPU's (`backend/cuda/layers.cu`), in the CPU's order, so a pass
//! on the device gives the CPU pass's hidden states and logits bit for bit.
//!
//! Only three things cross to the host: the input rows (embedding lookups), the router's
//! choices (to pick the experts whose weights the device needs) and the logits.

use super::device_index::{self, ScoreOrder, ScoredRows};
use super::dsa::{self, Selection, Sparse};
use super::gated_deltanet::GatedDeltaNet;
use super::gqa::Gqa;
use super::kda::{DeltaLayer, Kda, KdaProjected, L2Norm, SeqRecurrence, SeqRows};
use super::mla::{Mla, MlaProjected, MlaRows};
pub use super::on_device::OnDevice;
use super::on_device::{copy_rows, rms_norm};
use super::ops::Ops;
use crate::backend::WeightClass;
use crate::backend::abi::{self, RowSlice};
use crate::backend::device::DeviceOps;
use crate::config::KdaDecay;
use crate::error::Result;
use crate::kernels::Matrix;
use crate::kernels::reference::decode_row;
use crate::state::KdaShape;

/// Where the rows of a pass sit in a device attention cache: each row's position (for RoPE),
/// the cache row its key goes to, and the cache rows `start..end` it attends. A sequence's own
/// cache holds its positions as rows; the server's pooled cache offsets each sequence by the
/// base of its slot.
#[derive(Debug, Clone, Default)]
pub struct CacheRows {
    pub pos: Vec<usize>,
    pub at: Vec<usize>,
    pub seen: Vec<(usize, usize)>,
}

impl CacheRows {
    /// Rows at positions `pos`, row `i` in the cache region starting at `base[i]`, seeing the
    /// positions `seen(pos[i])` of its own region.
    pub fn new(pos: &[usize], base: &[usize], seen: impl Fn(usize) -> (usize, usize)) -> CacheRows {
        let (at, seen) = pos
            .iter()
            .zip(base)
            .map(|(&p, &b)| {
                let (s, e) = seen(p);
                (b + p, (b + s, b + e))
            })
            .unzip();
        CacheRows {
            pos: pos.to_vec(),
            at,
            seen,
        }
    }

    /// `values` as device row indices.
    fn upload<D: DeviceOps>(dev: &D, values: impl Iterator<Item = usize>) -> Result<D::Buf> {
        dev.upload_i32(&values.map(|v| v as i32).collect::<Vec<_>>())
    }
}

/// One sequence's own attention cache on the device (two buffers of `capacity` rows: keys and
/// values, or MLA latents and rotated shared keys), the first `len` filled.
#[derive(Debug)]
pub struct DeviceCache<B> {
    pub parts: [B; 2],
    pub len: usize,
    pub capacity: usize,
}

impl<B> DeviceCache<B> {
    /// An empty cache of `capacity` rows `widths` wide.
    pub fn new<D: DeviceOps<Buf = B>>(dev: &D, widths: [usize; 2], capacity: usize) -> Result<Self> {
        Ok(DeviceCache {
            parts: [
                dev.zeros_f32(capacity * widths[0])?,
                dev.zeros_f32(capacity * widths[1])?,
            ],
            len: 0,
            capacity,
        })
    }

    /// The next `n` positions' rows, each seeing `seen(p)`; taken now (the typed overflow past
    /// the capacity).
    pub fn take(&mut self, n: usize, seen: impl Fn(usize) -> (usize, usize)) -> Result<CacheRows> {
        if self.len + n > self.capacity {
            return Err(crate::Error::ContextOverflow {
                needed: self.len + n,
                limit: self.capacity,
            });
        }
        let pos: Vec<usize> = (self.len..self.len + n).collect();
        self.len += n;
        Ok(CacheRows::new(&pos, &vec![0; n], seen))
    }
}

/// Host rows (`width` values each) into the cache rows `at` of `cache`.
pub fn write_rows<D: DeviceOps>(
    dev: &D,
    rows: &[f32],
    width: usize,
    (cache, at): (&D::Buf, &[usize]),
) -> Result<()> {
    let src = dev.upload_f32(rows)?;
    let at = CacheRows::upload(dev, at.iter().copied())?;
    let dense = RowSlice {
        stride: width,
        col: 0,
    };
    copy_rows(
        dev,
        (&src, dense, None),
        (cache, dense, Some(&at)),
        rows.len() / width.max(1),
        width,
    )
}

/// What an attention core hands back besides its output: the rows' new cache entries (keys and
/// values, or latents and rotated keys), for a host copy of the cache.
pub type Keep<'k, B> = &'k mut dyn FnMut([&B; 2]) -> Result<()>;

/// A sparse (DSA) MLA layer's choice of the pass's rows' positions ([`Selection`]), made from its
/// projections once the rows' cache entries are kept; `None` for a dense layer, where every row
/// attends every position it sees.
pub type Choose<'c, B> = &'c mut dyn FnMut(&MlaProjected<B>) -> Result<Option<Selection>>;

/// A DSA layer's indexer keys on the device: the key pool (`head_dim` values per cache row) and
/// the pass's rows in it (each row's own cache row, and its sequence's keys: `seen`).
#[derive(Debug, Clone, Copy)]
pub struct IndexPool<'a, B> {
    pub keys: &'a B,
    pub rows: &'a CacheRows,
}

/// A DSA layer's choice of positions for the rows of `rows`, for its device core ([`Choose`]),
/// as `Mla::select` makes it on the CPU: the rows' indexer keys (`Indexer::keys`, on the host
/// from the normalised input `xn` brought down) appended to the host caches and written to the
/// device's key pool; the index scores of the rows past the top-k and their top-k on the device
/// (`deltafin_dsa_scores` over the pool, the CPU's order; `deltafin_dsa_topk`) from the queries
/// and head weights the host computes (`Indexer::select_with`). A layer sharing the last full
/// layer's choice takes it as is. `None` for a dense MLA layer.
pub fn choose_dsa<D: DeviceOps>(
    dev: &D,
    m: &Mla,
    (xn, n, p): (&D::Buf, usize, &MlaProjected<D::Buf>),
    pool: Option<IndexPool<'_, D::Buf>>,
    rows: &mut MlaRows<'_, '_>,
) -> Result<Option<Selection>> {
    let ix = match &m.sparse {
        None => return Ok(None),
        Some(Sparse::Shared) => return Ok(Some(rows.selection.clone())),
        Some(Sparse::Index(ix)) => ix,
    };
    let (Some(q), Some(pool)) = (&p.q_resid, pool) else {
        return Err(crate::Error::InvalidArgument {
            field: "device",
            reason: "a DSA indexer needs a low-rank query latent and a device key pool".into(),
        });
    };
    let (x, q_resid) = (dev.download_f32(xn)?, dev.download_f32(q)?);
    let pos = |i: usize| rows.pos[i];
    let d = ix.dims().head_dim;
    let keys = ix.keys(&x, n, &pos);
    for (i, k) in keys.chunks(d).enumerate() {
        rows.caches[rows.seq[i]].index_keys.push(k);
    }
    write_rows(dev, &keys, d, (pool.keys, &pool.rows.at))?;
    let choose = |sparse: &[usize], q: &[f32], w: &[f32]| device_choose(dev, ix.dims(), pool, (sparse, q, w));
    let selection = ix.select_with(&x, &q_resid, n, &pos, choose)?;
    rows.selection.clone_from(&selection);
    Ok(Some(selection))
}

/// The top-k positions of the rows `sparse` (queries `q`, scaled head weights `w`: all the
/// pass's rows) over their sequences' keys in `pool`: scores and top-k on the device
/// ([`device_index::top_keys`] in DSA's order).
fn device_choose<D: DeviceOps>(
    dev: &D,
    dims: dsa::IndexerDims,
    pool: IndexPool<'_, D::Buf>,
    (sparse, q, w): (&[usize], &[f32], &[f32]),
) -> Result<Vec<Vec<u32>>> {
    let (h, d) = (dims.heads, dims.head_dim);
    let spans: Vec<(usize, usize)> = sparse
        .iter()
        .map(|&i| {
            let (s, e) = pool.rows.seen[i];
            (s, e - s)
        })
        .collect();
    let rows = ScoredRows {
        rows: sparse,
        spans: &spans,
        q,
        w,
    };
    device_index::top_keys(dev, pool.keys, (h, d, dims.topk), rows, ScoreOrder::Dsa)
}

/// An MLA layer's device-resident constant: the decoded `kv_b_proj`.
#[derive(Debug)]
pub struct DeviceMla<B> {
    wkv: B,
}

impl<B> DeviceMla<B> {
    /// Upload `m`'s constants.
    pub fn new<D: DeviceOps<Buf = B>>(dev: &D, m: &Mla) -> Result<Self> {
        let kv = &m.kv_b;
        let mut wkv = vec![0.0f32; kv.rows * kv.cols];
        for (r, row) in wkv.chunks_mut(kv.cols).enumerate() {
            decode_row(kv, r, row);
        }
        Ok(DeviceMla {
            wkv: dev.upload_f32(&wkv)?,
        })
    }
}

/// Absorbed MLA over `n` normalised rows placed by `rows` in `cache` (latents, rotated keys):
/// the layer's written-once projections (`Mla::run`) around the device's attention core, which
/// writes the rows' latents and keys (handing them to `keep`), attends and projects the values.
pub fn mla<D: DeviceOps>(
    dev: &D,
    (m, k): (&Mla, &DeviceMla<D::Buf>),
    (x, n): (&D::Buf, usize),
    (rows, cache): (&CacheRows, [&D::Buf; 2]),
    (keep, choose): (Keep<'_, D::Buf>, Choose<'_, D::Buf>),
) -> Result<D::Buf> {
    m.run(&OnDevice(dev), x, n, &rows.pos, |p| {
        mla_core(dev, (m, &k.wkv), p, (rows, cache), (keep, choose))
    })
}

/// The device's MLA attention core: the rows' latents and keys into the cache, the absorbed
/// queries, attention over each row's cache rows or (DSA) its chosen ones (one block, or every
/// block then the ascending merge: the same operations either way), the value projection.
fn mla_core<D: DeviceOps>(
    dev: &D,
    (m, wkv): (&Mla, &D::Buf),
    p: MlaProjected<D::Buf>,
    (rows, [latent, rope]): (&CacheRows, [&D::Buf; 2]),
    (keep, choose): (Keep<'_, D::Buf>, Choose<'_, D::Buf>),
) -> Result<D::Buf> {
    let (d, n) = (&m.dims, p.rows);
    let (c, r) = (d.kv_lora, d.rope);
    let dense = |w| RowSlice { stride: w, col: 0 };
    let at = CacheRows::upload(dev, rows.at.iter().copied())?;
    copy_rows(
        dev,
        (&p.latent, dense(c), None),
        (latent, dense(c), Some(&at)),
        n,
        c,
    )?;
    copy_rows(
        dev,
        (&p.k_rope, dense(r), None),
        (rope, dense(r), Some(&at)),
        n,
        r,
    )?;
    keep([&p.latent, &p.k_rope])?;
    let chosen = Chosen::new(dev, rows, choose(&p)?.as_ref())?;
    let (q_abs, q_rope) = (dev.zeros_f32(n * d.heads * c)?, dev.zeros_f32(n * d.heads * r)?);
    dev.layer(
        &abi::mla_absorb(n, d),
        &[Some(&p.q), Some(wkv), Some(&q_abs), Some(&q_rope)],
    )?;
    let info = CacheRows::upload(dev, chosen.spans.iter().flat_map(|&(s, len)| [s, len]))?;
    let ctx = dev.zeros_f32(n * d.heads * c)?;
    let longest = chosen.spans.iter().map(|&(_, len)| len).max().unwrap_or(0);
    let blocks = longest.div_ceil(abi::MLA_BLOCK);
    let [list, at] = chosen
        .bufs
        .as_ref()
        .map_or([None, None], |[l, a]| [Some(l), Some(a)]);
    if blocks <= 1 {
        let bufs = [
            Some(&q_abs),
            Some(&q_rope),
            Some(latent),
            Some(rope),
            Some(&info),
            Some(&ctx),
            list,
            at,
        ];
        dev.layer(&abi::mla_attend(n, d.heads, c, r, d.scale)?, &bufs)?;
    } else {
        let parts = dev.zeros_f32(n * d.heads * blocks * (c + 2))?;
        let bufs = [
            Some(&q_abs),
            Some(&q_rope),
            Some(latent),
            Some(rope),
            Some(&info),
            Some(&parts),
            list,
            at,
        ];
        dev.layer(&abi::mla_partials(n, d.heads, (c, r), d.scale, blocks)?, &bufs)?;
        let bufs = [Some(&parts), Some(&info), Some(&ctx)];
        dev.layer(&abi::mla_merge(n, d.heads, c, blocks), &bufs)?;
    }
    let attn = dev.zeros_f32(n * d.heads * d.v)?;
    dev.layer(&abi::mla_values(n, d), &[Some(wkv), Some(&ctx), Some(&attn)])?;
    Ok(attn)
}

/// The keys each row of an MLA pass attends: `spans[i]` is row `i`'s first cache row and key
/// count; with a DSA selection, `bufs` holds every sparse row's chosen positions (ascending,
/// from its first row) and each row's offset in them (-1: the row attends all it sees).
struct Chosen<B> {
    spans: Vec<(usize, usize)>,
    bufs: Option<[B; 2]>,
}

impl<B> Chosen<B> {
    fn new<D: DeviceOps<Buf = B>>(dev: &D, rows: &CacheRows, selection: Option<&Selection>) -> Result<Self> {
        let mut spans: Vec<(usize, usize)> = rows.seen.iter().map(|&(s, e)| (s, e - s)).collect();
        let Some(selection) = selection.filter(|s| s.iter().any(Option::is_some)) else {
            return Ok(Chosen { spans, bufs: None });
        };
        let (mut list, mut at) = (Vec::new(), Vec::with_capacity(spans.len()));
        for (span, chosen) in spans.iter_mut().zip(selection) {
            match chosen {
                Some(c) => {
                    at.push(list.len() as i32);
                    list.extend(c.iter().map(|&p| p as i32));
                    span.1 = c.len();
                }
                None => at.push(-1),
            }
        }
        Ok(Chosen {
            spans,
            bufs: Some([dev.upload_i32(&list)?, dev.upload_i32(&at)?]),
        })
    }
}

/// Grouped-query attention over `n` normalised rows placed by `rows` in `cache` (keys,
/// values): the layer's written-once projections (`Gqa::run`) around the device's core, which
/// writes the rows' keys and values (handing them to `keep`) and attends
/// (`deltafin_gqa_attend`: the CPU's order, sinks and window).
pub fn gqa<D: DeviceOps>(
    dev: &D,
    g: &Gqa,
    (x, n): (&D::Buf, usize),
    (rows, [k, v]): (&CacheRows, [&D::Buf; 2]),
    keep: Keep<'_, D::Buf>,
) -> Result<D::Buf> {
    let d = g.dims();
    let launch = abi::gqa_attend(n, (d.heads, d.kv_heads, d.head_dim), d.scale())?;
    g.run(&OnDevice(dev), x, n, &rows.pos, |p| {
        let kw = d.kv_heads * d.head_dim;
        let dense = RowSlice { stride: kw, col: 0 };
        let at = CacheRows::upload(dev, rows.at.iter().copied())?;
        copy_rows(dev, (&p.k, dense, None), (k, dense, Some(&at)), n, kw)?;
        copy_rows(dev, (&p.v, dense, None), (v, dense, Some(&at)), n, kw)?;
        keep([&p.k, &p.v])?;
        let info = CacheRows::upload(dev, rows.seen.iter().flat_map(|&(s, e)| [s, e]))?;
        let sinks = g.sinks().map(|s| dev.upload_f32(s)).transpose()?;
        let out = dev.zeros_f32(n * d.heads * d.head_dim)?;
        let bufs = [
            Some(&p.q),
            Some(k),
            Some(v),
            sinks.as_ref(),
            Some(&info),
            Some(&out),
        ];
        dev.layer(&launch, &bufs)?;
        Ok(out)
    })
}

/// One sequence's KDA state on the device: the convolution history and the per-head state.
#[derive(Debug)]
pub struct DeviceKdaState<B> {
    pub conv: B,
    pub state: B,
}

impl<B> DeviceKdaState<B> {
    /// A fresh (zero) state of a delta-rule layer of shape `s`, as a new CPU sequence has.
    pub fn new<D: DeviceOps<Buf = B>>(dev: &D, s: KdaShape) -> Result<Self> {
        Ok(DeviceKdaState {
            conv: dev.zeros_f32(s.conv_len())?,
            state: dev.zeros_f32(s.heads * s.head_dim * s.head_dim)?,
        })
    }
}

/// Rows of one sequence in a served pass from which its delta rule runs on the device: the
/// state goes up and comes back down (`8·heads·d²` bytes: 4 MB for 32 heads of 128), about what
/// the host recurrence of a few rows costs (`3·heads·d²` multiply-adds a row). So decode rows
/// stay on the host, and prefill chunks and wide verify passes run on the device.
pub const DEVICE_RECURRENCE_ROWS: usize = 8;

/// The served device's delta rule for a pass's long sequences (`deltafin_kda_recurrence`),
/// around the host state of record: the pre-pass state up, the rows stepped, the state and
/// the read-outs down.
pub struct DeviceRecurrence<'d, D> {
    pub dev: &'d D,
    pub shape: KdaShape,
    /// The fewest rows a sequence runs here ([`DEVICE_RECURRENCE_ROWS`]).
    pub min_rows: usize,
}

impl<D> std::fmt::Debug for DeviceRecurrence<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceRecurrence({:?}, from {} rows)",
            self.shape, self.min_rows
        )
    }
}

impl<D: DeviceOps> SeqRecurrence for DeviceRecurrence<'_, D> {
    fn takes(&self, rows: usize) -> bool {
        rows >= self.min_rows
    }

    fn run(&mut self, r: SeqRows<'_>, (prev, live): (Option<&[f32]>, &mut [f32])) -> Result<Vec<f32>> {
        let (dev, s) = (self.dev, self.shape);
        let state = dev.upload_f32(prev.unwrap_or(live))?;
        let (qkv, g, beta) = (
            dev.upload_f32(r.qkv)?,
            dev.upload_f32(r.g)?,
            dev.upload_f32(r.beta)?,
        );
        let seq_rows = dev.upload_i32(&[0, r.rows as i32])?;
        let ids = dev.upload_i32(&(0..r.rows as i32).collect::<Vec<_>>())?;
        let out = dev.zeros_f32(r.rows * s.channels())?;
        let bufs = [
            Some(&state),
            Some(&qkv),
            Some(&g),
            Some(&beta),
            Some(&seq_rows),
            Some(&ids),
            Some(&out),
        ];
        dev.layer(&abi::kda_recurrence(1, s.heads, s.head_dim)?, &bufs)?;
        live.copy_from_slice(&dev.download_f32(&state)?);
        dev.download_f32(&out)
    }
}

/// A delta-rule layer's (KDA or gated DeltaNet) device-resident constants and how its core
/// reads them.
#[derive(Debug)]
pub struct DeviceDelta<B> {
    conv: B,
    dt_bias: B,
    rate: B,
    o_norm: B,
    shape: KdaShape,
    l2: L2Norm,
    q_scale: f32,
    decay: KdaDecay,
    eps: f32,
    /// Gated DeltaNet: the decay input `a` is per head and the norm gate is SiLU (KDA: per
    /// channel, sigmoid).
    per_head: bool,
}

impl<B> DeviceDelta<B> {
    /// Upload KDA layer `k`'s constants.
    pub fn kda<D: DeviceOps<Buf = B>>(dev: &D, k: &Kda) -> Result<Self> {
        Ok(DeviceDelta {
            conv: dev.upload_f32(&k.conv)?,
            dt_bias: dev.upload_f32(&k.dt_bias)?,
            rate: dev.upload_f32(&k.decay_rate)?,
            o_norm: dev.upload_f32(&k.o_norm)?,
            shape: k.shape,
            l2: k.l2,
            q_scale: k.q_scale,
            decay: k.decay,
            eps: k.eps,
            per_head: false,
        })
    }

    /// Upload gated-DeltaNet layer `g`'s constants.
    pub fn gated_deltanet<D: DeviceOps<Buf = B>>(dev: &D, g: &GatedDeltaNet) -> Result<Self> {
        Ok(DeviceDelta {
            conv: dev.upload_f32(&g.conv)?,
            dt_bias: dev.upload_f32(&g.dt_bias)?,
            rate: dev.upload_f32(&g.decay_rate)?,
            o_norm: dev.upload_f32(&g.norm)?,
            shape: g.shape,
            l2: g.l2(),
            q_scale: g.q_scale(),
            decay: KdaDecay::Softplus,
            eps: g.eps,
            per_head: true,
        })
    }
}

/// A delta-rule layer (KDA or gated DeltaNet) over `n` normalised rows of one sequence,
/// advancing its state: the layer's written-once projections (`Kda::run`,
/// `GatedDeltaNet::run`) around the device's delta-rule core.
pub(crate) fn delta<D: DeviceOps>(
    dev: &D,
    (layer, c): (&impl DeltaLayer, &DeviceDelta<D::Buf>),
    x: &D::Buf,
    n: usize,
    st: &mut DeviceKdaState<D::Buf>,
) -> Result<D::Buf> {
    layer.run(&OnDevice(dev), x, n, |p| delta_core(dev, c, p, n, st))
}

/// The device's delta-rule core over one sequence's `n` rows: the convolution with the device
/// history, L2 norms and q scale, the log-decay and β, the delta rule on the device state and
/// the gated norm (the read-out `[n, P]`).
fn delta_core<D: DeviceOps>(
    dev: &D,
    c: &DeviceDelta<D::Buf>,
    p: KdaProjected<D::Buf>,
    n: usize,
    st: &mut DeviceKdaState<D::Buf>,
) -> Result<D::Buf> {
    let s = c.shape;
    let (ch, heads, hd) = (s.channels(), s.heads, s.head_dim);
    let seq_rows = dev.upload_i32(&[0, n as i32])?;
    let row_ids = dev.upload_i32(&(0..n as i32).collect::<Vec<_>>())?;
    let qkv = dev.zeros_f32(n * 3 * ch)?;
    let conv = abi::kda_conv(1, 3 * ch, s.kernel);
    let bufs = [&p.qkv, &c.conv, &st.conv, &seq_rows, &row_ids, &qkv].map(Some);
    dev.layer(&conv, &bufs)?;
    dev.layer(&abi::kda_l2(n, heads, hd, c.l2, c.q_scale), &[Some(&qkv)])?;
    let (g, beta) = (dev.zeros_f32(n * ch)?, dev.zeros_f32(n * heads)?);
    let bufs = [&p.f, &c.dt_bias, &c.rate, &p.beta, &g, &beta].map(Some);
    let group = if c.per_head { hd } else { 1 };
    dev.layer(&abi::kda_gates(n, (ch, group), heads, c.decay), &bufs)?;
    let o = dev.zeros_f32(n * ch)?;
    let bufs = [&st.state, &qkv, &g, &beta, &seq_rows, &row_ids, &o].map(Some);
    dev.layer(&abi::kda_recurrence(1, heads, hd)?, &bufs)?;
    let normed = dev.zeros_f32(n * ch)?;
    let bufs = [&o, &c.o_norm, &normed, &p.gate].map(Some);
    dev.layer(&abi::gated_rms_norm(n * heads, hd, c.eps, c.per_head), &bufs)?;
    Ok(normed)
}

/// The last of `n` hidden rows (`h` wide) through the final norm and the head: its logits,
/// copied to the host.
pub fn last_row_logits<D: DeviceOps>(
    dev: &D,
    x: &D::Buf,
    (n, h): (usize, usize),
    (norm, eps): (&D::Buf, f32),
    lm_head: &Matrix,
) -> Result<Vec<f32>> {
    let last = dev.zeros_f32(h)?;
    let rows = RowSlice { stride: h, col: 0 };
    let at = dev.upload_i32(&[n as i32 - 1])?;
    copy_rows(dev, (x, rows, Some(&at)), (&last, rows, None), 1, h)?;
    let normed = rms_norm(dev, &last, norm, 1, h, eps)?;
    let logits = OnDevice(dev).project(lm_head, WeightClass::Spine, &normed, 1)?;
    dev.download_f32(&logits)
}
