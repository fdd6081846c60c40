//! Multi-head latent attention (DeepSeek-V2/V3, Kimi). The cache holds only the normalised
//! latent `c_kv` and the rotated shared key of each position; attention runs in the absorbed
//! form: `q_nope · (W_UK c) = (W_UKᵀ q_nope) · c` and `v = W_UV Σ α c`, which is the HF expanded
//! computation with a different (f32) rounding order, and lets the context grow without per-head
//! keys and values. Every row attends over its own sequence's cache only, in position order, so
//! results do not depend on the batch.
//!
//! Variants: NoPE attention (Kimi-Linear, K3: `rotary: None`, the shared key channels are used
//! unrotated), K3's gated MLA (`out_gate`: `attn ← attn ⊙ σ(W_g x)` before `o_proj`) and
//! DeepSeek Sparse Attention (`sparse`: each row attends to the positions the lightning indexer
//! chose, [`super::dsa`]).

use rayon::prelude::*;

use super::dsa::{Selection, Sparse};
use super::latent_attention::{self, LatentKeys, LatentQuery, LatentShape, dot16};
use super::ops::{Host, Ops};
use super::rope::Rope;
use crate::backend::WeightClass;
use crate::backend::abi::RopeLayout;
use crate::error::Result;
use crate::kernels::Matrix;
pub use crate::kernels::layer_spec::MlaDims;
use crate::kernels::reference::decode_row;
use crate::state::MlaCache;

/// The query projection.
#[derive(Debug, Clone)]
pub enum QProj {
    /// `q_proj` (`q_lora_rank: null`).
    Full(Matrix),
    /// `q_b_proj(RMSNorm(q_a_proj(x)))`.
    LowRank { a: Matrix, norm: Vec<f32>, b: Matrix },
}

/// One MLA layer's weights.
#[derive(Debug, Clone)]
pub struct Mla {
    pub dims: MlaDims,
    pub q: QProj,
    pub kv_a: Matrix,
    pub kv_a_norm: Vec<f32>,
    pub kv_b: Matrix,
    pub o: Matrix,
    /// `None` for NoPE attention (the rope channels are used unrotated).
    pub rotary: Option<Rope>,
    /// Sigmoid output gate `g_proj` `[heads * v, hidden]` (K3), applied before `o_proj`.
    pub out_gate: Option<Matrix>,
    /// DeepSeek Sparse Attention: the positions each row attends to (`None`: all).
    pub sparse: Option<Sparse>,
}

/// What [`Mla::run`] hands its attention core for `rows` rows: the cache entries (normalised
/// latents `[rows, kv_lora]`, rotated shared keys `[rows, rope]`), the rotated queries
/// `[rows, heads * (nope + rope)]` and, with a low-rank query projection, the normalised query
/// latents (DSA's indexer reads them).
#[derive(Debug)]
pub struct MlaProjected<B> {
    pub rows: usize,
    pub latent: B,
    pub k_rope: B,
    pub q: B,
    pub q_resid: Option<B>,
}

/// Where each row of a pass goes: its cache and position.
#[derive(Debug)]
pub struct MlaRows<'a, 'c> {
    /// `caches[seq[i]]` is row i's sequence cache.
    pub caches: &'a mut [&'c mut MlaCache],
    pub seq: &'a [usize],
    pub pos: &'a [usize],
    /// The selection of the pass's last full DSA layer: written by a layer with an indexer,
    /// read by a layer that shares it.
    pub selection: &'a mut Selection,
}

impl Mla {
    /// Load the DeepSeek-named MLA block under `a` (`{a}.q_proj`, or `{a}.q_a_proj` +
    /// `q_a_layernorm` + `q_b_proj` when `q_lora_rank` is set; `kv_a_proj_with_mqa`,
    /// `kv_a_layernorm`, `kv_b_proj`, `o_proj`), every shape checked against `dims`.
    pub fn load(
        ld: &crate::model::Loader<'_>,
        a: &str,
        hidden: usize,
        q_lora_rank: Option<usize>,
        dims: MlaDims,
        rotary: Option<Rope>,
        out_gate: Option<Matrix>,
    ) -> crate::Result<Mla> {
        let (heads, qk) = (dims.heads, dims.nope + dims.rope);
        let q = match q_lora_rank {
            None => QProj::Full(ld.linear(&format!("{a}.q_proj"), heads * qk, hidden)?),
            Some(r) => QProj::LowRank {
                a: ld.linear(&format!("{a}.q_a_proj"), r, hidden)?,
                norm: ld.vector(&format!("{a}.q_a_layernorm.weight"), r)?,
                b: ld.linear(&format!("{a}.q_b_proj"), heads * qk, r)?,
            },
        };
        Ok(Mla {
            q,
            kv_a: ld.linear(
                &format!("{a}.kv_a_proj_with_mqa"),
                dims.kv_lora + dims.rope,
                hidden,
            )?,
            kv_a_norm: ld.vector(&format!("{a}.kv_a_layernorm.weight"), dims.kv_lora)?,
            kv_b: ld.linear(
                &format!("{a}.kv_b_proj"),
                heads * (dims.nope + dims.v),
                dims.kv_lora,
            )?,
            o: ld.linear(&format!("{a}.o_proj"), hidden, heads * dims.v)?,
            rotary,
            out_gate,
            sparse: None,
            dims,
        })
    }

    /// The cache entries of `n` normalised rows `x` at positions `pos` on `o`'s device: the
    /// RMS-normalised latents `[n, kv_lora]` and the rotated shared keys `[n, rope]`.
    pub fn context<O: Ops>(&self, o: &O, x: &O::Buf, n: usize, pos: &[usize]) -> Result<(O::Buf, O::Buf)> {
        let d = &self.dims;
        let (c, r) = (d.kv_lora, d.rope);
        let ckv = o.project(&self.kv_a, WeightClass::Spine, x, n)?;
        let latent = o.assemble(n, &[(&ckv, (c + r, 0, c))])?;
        let latent = o.rms_norm(&latent, &o.constant(&self.kv_a_norm)?, n, c, d.eps)?;
        let k_rope = o.assemble(n, &[(&ckv, (c + r, c, r))])?;
        let k_rope = match &self.rotary {
            Some(rope) => {
                let one = RopeLayout {
                    vecs: 1,
                    row_stride: r,
                    offset: 0,
                    vec_stride: r,
                };
                o.rope(k_rope, n, one, rope, pos)?
            }
            None => k_rope,
        };
        Ok((latent, k_rope))
    }

    /// The rotated queries `[n, heads * (nope + rope)]` of `n` normalised rows at positions
    /// `pos`, and with a low-rank projection the normalised query latents `[n, q_lora_rank]`.
    fn queries<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        pos: &[usize],
    ) -> Result<(O::Buf, Option<O::Buf>)> {
        let d = &self.dims;
        let (q, resid) = match &self.q {
            QProj::Full(m) => (o.project(m, WeightClass::Spine, x, n)?, None),
            QProj::LowRank { a, norm, b } => {
                let qa = o.project(a, WeightClass::Spine, x, n)?;
                let qa = o.rms_norm(&qa, &o.constant(norm)?, n, a.rows, d.eps)?;
                (o.project(b, WeightClass::Spine, &qa, n)?, Some(qa))
            }
        };
        let qk = d.nope + d.rope;
        let heads = RopeLayout {
            vecs: d.heads,
            row_stride: d.heads * qk,
            offset: d.nope,
            vec_stride: qk,
        };
        match &self.rotary {
            Some(rope) => Ok((o.rope(q, n, heads, rope, pos)?, resid)),
            None => Ok((q, resid)),
        }
    }

    /// The layer over `n` normalised rows `x` at positions `pos` on `o`'s device, written once:
    /// the cache entries and rotated queries ([`MlaProjected`]) go to the device's attention
    /// `core` (which appends the entries to the rows' caches and returns the attention values
    /// `[n, heads * v]`), then K3's sigmoid output gate and `o_proj`.
    pub fn run<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        pos: &[usize],
        core: impl FnOnce(MlaProjected<O::Buf>) -> Result<O::Buf>,
    ) -> Result<O::Buf> {
        let (q, q_resid) = self.queries(o, x, n, pos)?;
        let (latent, k_rope) = self.context(o, x, n, pos)?;
        let attn = core(MlaProjected {
            rows: n,
            latent,
            k_rope,
            q,
            q_resid,
        })?;
        let attn = match &self.out_gate {
            Some(gate) => {
                let g = o.project(gate, WeightClass::Spine, x, n)?;
                o.mul_sigmoid(attn, &g, n * gate.rows)?
            }
            None => attn,
        };
        o.project(&self.o, WeightClass::Spine, &attn, n)
    }

    /// The cache entries of `n` normalised rows `x` at positions `start..` (see
    /// [`Mla::context`]) appended to `cache`, on the CPU.
    pub fn append_context(&self, cache: &mut MlaCache, x: &[f32], n: usize, start: usize) {
        let pos: Vec<usize> = (start..start + n).collect();
        let (latent, k_rope) = self
            .context(&Host, &x.to_vec(), n, &pos)
            .expect("the CPU runs every MLA form");
        (0..n).for_each(|i| self.push_row(cache, (&latent, &k_rope), i));
    }

    /// Row `i` of the latents and rotated keys appended to `cache`.
    pub(crate) fn push_row(&self, cache: &mut MlaCache, (latent, k_rope): (&[f32], &[f32]), i: usize) {
        let (c, r) = (self.dims.kv_lora, self.dims.rope);
        cache.latent.push(&latent[i * c..(i + 1) * c]);
        cache.k_rope.push(&k_rope[i * r..(i + 1) * r]);
    }

    /// Attention output `[n, hidden]` for normalised rows `x` on the CPU; appends every row's
    /// latent and rotated key (and indexer key) to its cache first (rows of one sequence are
    /// consecutive positions).
    pub fn forward(&self, x: &[f32], n: usize, rows: &mut MlaRows<'_, '_>) -> Vec<f32> {
        let x = x.to_vec();
        let pos = rows.pos.to_vec();
        self.run(&Host, &x, n, &pos, |p| {
            for (i, &at) in pos.iter().enumerate().take(n) {
                let cache = &mut rows.caches[rows.seq[i]];
                debug_assert_eq!(cache.latent.len(), at, "rows must extend their cache in order");
                self.push_row(cache, (&p.latent, &p.k_rope), i);
            }
            let q_resid = p.q_resid.unwrap_or_default();
            let sparse = self.select(&x, &q_resid, n, rows).then_some(&*rows.selection);
            let shape = self.latent_shape();
            let caches: Vec<&MlaCache> = rows.caches.iter().map(|c| &**c).collect();
            let keys: Vec<(LatentKeys<'_>, usize)> = (0..n)
                .map(|i| {
                    let c = caches[rows.seq[i]];
                    match sparse.and_then(|s: &Selection| s[i].as_deref()) {
                        Some(p) => (LatentKeys::chosen(&c.latent, &c.k_rope, p, shape), p.len()),
                        None => (LatentKeys::one(&c.latent, &c.k_rope, shape), pos[i] + 1),
                    }
                })
                .collect();
            Ok(self.attend_rows(&p.q, n, &|i| keys[i]))
        })
        .expect("the CPU runs every MLA form")
    }

    /// Whether this layer is sparse; if so `rows.selection` holds its rows' choice. A layer with
    /// an indexer appends its rows' indexer keys and chooses, leaving its choice there for the
    /// layers that share it (the device's form: `layers::device::choose_dsa`).
    fn select(&self, x: &[f32], q_resid: &[f32], n: usize, rows: &mut MlaRows<'_, '_>) -> bool {
        let indexer = match &self.sparse {
            None => return false,
            Some(Sparse::Shared) => {
                debug_assert_eq!(rows.selection.len(), n, "a shared DSA layer follows a full one");
                return true;
            }
            Some(Sparse::Index(ix)) => ix,
        };
        let keys = indexer.keys(x, n, &|i| rows.pos[i]);
        for (i, k) in keys.chunks(indexer.dims().head_dim).enumerate() {
            rows.caches[rows.seq[i]].index_keys.push(k);
        }
        let caches: Vec<&MlaCache> = rows.caches.iter().map(|c| &**c).collect();
        let (seq, pos) = (rows.seq, rows.pos);
        *rows.selection = indexer.select(x, q_resid, n, &|i| pos[i], &|i| {
            (&caches[seq[i]].index_keys).into()
        });
        true
    }

    /// Attention output `[n, hidden]` for `n` normalised rows `x` at positions
    /// `base..base + n` that attend to every position of `cache` and to all `n` rows (no causal
    /// mask inside the block, as a block draft head needs); nothing is cached.
    pub fn forward_block(&self, x: &[f32], n: usize, cache: &MlaCache, base: usize) -> Vec<f32> {
        debug_assert!(self.sparse.is_none(), "block drafting heads are dense MLA");
        let pos: Vec<usize> = (base..base + n).collect();
        self.run(&Host, &x.to_vec(), n, &pos, |p| {
            let mut block = MlaCache::default();
            (0..n).for_each(|i| self.push_row(&mut block, (&p.latent, &p.k_rope), i));
            let shape = self.latent_shape();
            let keys = LatentKeys::two(
                ((&cache.latent).into(), (&cache.k_rope).into()),
                ((&block.latent).into(), (&block.k_rope).into()),
                shape,
            );
            let len = keys.len(shape);
            Ok(self.attend_rows(&p.q, n, &|_| (keys, len)))
        })
        .expect("the CPU runs every MLA form")
    }

    fn latent_shape(&self) -> LatentShape {
        let d = &self.dims;
        LatentShape {
            heads: d.heads,
            latent: d.kv_lora,
            rope: d.rope,
            scale: d.scale,
        }
    }

    /// Attention values `[n, heads * v]` of the rotated queries `q` `[n, heads * (nope + rope)]`;
    /// row `i` attends to the first `len` positions of `keys` where `(keys, len) = at(i)`.
    /// Absorption and the value projection run row-parallel; the softmax core is
    /// [`latent_attention::attend`]. Up to [`DIRECT_ROWS`] rows read `kv_b_proj` as stored,
    /// decoding each of its rows where it is used; more rows decode it once into f32 and share
    /// it. The values and the order of operations are the same either way.
    fn attend_rows<'k>(
        &self,
        q: &[f32],
        n: usize,
        at: &(dyn Fn(usize) -> (LatentKeys<'k>, usize) + Sync),
    ) -> Vec<f32> {
        let d = &self.dims;
        let (qk, c) = (d.nope + d.rope, d.kv_lora);
        let direct = n <= DIRECT_ROWS;
        let wkv = if direct { Vec::new() } else { self.decoded_kv_b() };
        let head_rows = |h: usize| &wkv[h * (d.nope + d.v) * c..(h + 1) * (d.nope + d.v) * c];
        // Every (row, head) pair is its own task: a decode step (one row) still uses every core.
        let mut q_abs = vec![0.0f32; n * d.heads * c];
        q_abs.par_chunks_mut(c).enumerate().for_each(|(t, qa)| {
            let h = t % d.heads;
            let qh = &q[t * qk..][..qk];
            if direct {
                absorb_query_stored(&self.kv_b, h * (d.nope + d.v), &qh[..d.nope], qa);
            } else {
                absorb_query(&qh[..d.nope], &head_rows(h)[..d.nope * c], qa);
            }
        });
        let mut q_rope = vec![0.0f32; n * d.heads * d.rope];
        for (qr, qh) in q_rope.chunks_mut(d.rope).zip(q.chunks(qk)) {
            qr.copy_from_slice(&qh[d.nope..]);
        }
        let queries: Vec<LatentQuery<'_>> = (0..n)
            .map(|i| {
                let (keys, len) = at(i);
                LatentQuery {
                    q_abs: &q_abs[i * d.heads * c..][..d.heads * c],
                    q_rope: &q_rope[i * d.heads * d.rope..][..d.heads * d.rope],
                    keys,
                    len,
                }
            })
            .collect();
        let mut ctx = vec![0.0f32; n * d.heads * c];
        latent_attention::attend(&queries, self.latent_shape(), &mut ctx);
        let mut attn = vec![0.0f32; n * d.heads * d.v];
        attn.par_chunks_mut(d.v)
            .zip(ctx.par_chunks(c))
            .enumerate()
            .for_each(|(t, (out, ctx))| {
                let h = t % d.heads;
                if direct {
                    value_head_stored(&self.kv_b, h * (d.nope + d.v) + d.nope, ctx, out);
                } else {
                    value_head(head_rows(h), ctx, d, out);
                }
            });
        if !direct {
            *kv_b_scratch() = wkv;
        }
        attn
    }

    /// Output gate (K3) and `o_proj`.
    /// `kv_b_proj` decoded row by row (the exact element values), `[heads*(nope+v), kv_lora]`,
    /// in the process's scratch buffer (taken; `attend_rows` puts it back), so a decode step
    /// does not map, fault in and unmap a fresh buffer per layer.
    fn decoded_kv_b(&self) -> Vec<f32> {
        let m = &self.kv_b;
        let mut w = std::mem::take(&mut *kv_b_scratch());
        w.resize(m.rows * m.cols, 0.0);
        w.par_chunks_mut(m.cols)
            .enumerate()
            .for_each(|(r, row)| decode_row(m, r, row));
        w
    }
}

/// Rows per pass up to which the MLA layer reads `kv_b_proj` as stored instead of decoding it
/// whole into f32 first. A decode step touches each of its values once, so decoding the layer
/// into an f32 copy four times its BF16 size and reading that back only added traffic
/// (`dsv3-bench` in memory, 2 interleaved rounds: 8.92–9.08 → 9.21–9.57 tok/s).
const DIRECT_ROWS: usize = 4;

/// The decoded `kv_b_proj` buffer of [`Mla::decoded_kv_b`], kept between calls. One for the
/// process (not one per thread): passes move between pool workers, and per-thread buffers would
/// each keep a largest-layer copy outside the memory budget. A concurrent caller finds it taken
/// and allocates its own.
fn kv_b_scratch() -> std::sync::MutexGuard<'static, Vec<f32>> {
    static SCRATCH: std::sync::Mutex<Vec<f32>> = std::sync::Mutex::new(Vec::new());
    SCRATCH.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One row's attention values `[heads, v]` from its latent contexts `ctx` `[heads, kv_lora]`:
/// `dot16(W_UV[h, e], ctx[h])` with `wkv` the decoded `kv_b_proj` (`deltafin_mla_values`).
pub fn value_rows(wkv: &[f32], ctx: &[f32], d: &MlaDims, out: &mut [f32]) {
    let c = d.kv_lora;
    for h in 0..d.heads {
        let rows = &wkv[h * (d.nope + d.v) * c..(h + 1) * (d.nope + d.v) * c];
        value_head(rows, &ctx[h * c..][..c], d, &mut out[h * d.v..][..d.v]);
    }
}

/// One head's values `[v]` from its latent context `ctx` `[kv_lora]`; `rows` are the head's
/// decoded `kv_b_proj` rows `[nope + v, kv_lora]`.
fn value_head(rows: &[f32], ctx: &[f32], d: &MlaDims, out: &mut [f32]) {
    let c = d.kv_lora;
    for (e, o) in out.iter_mut().enumerate() {
        *o = dot16(&rows[(d.nope + e) * c..][..c], ctx);
    }
}

/// [`absorb_query`] with `W_UK` read from `kv_b` as stored: its rows `first..first + nope`,
/// each decoded where it is used (the same values, the same operations).
fn absorb_query_stored(kv_b: &Matrix, first: usize, q_nope: &[f32], q_abs: &mut [f32]) {
    let mut w = vec![0.0f32; q_abs.len()];
    q_abs.iter_mut().for_each(|v| *v = 0.0);
    for (dim, &qv) in q_nope.iter().enumerate() {
        decode_row(kv_b, first + dim, &mut w);
        for (a, &w) in q_abs.iter_mut().zip(&w) {
            *a += qv * w;
        }
    }
}

/// [`value_head`] with `W_UV` read from `kv_b` as stored: rows `first..first + out.len()`.
fn value_head_stored(kv_b: &Matrix, first: usize, ctx: &[f32], out: &mut [f32]) {
    let mut w = vec![0.0f32; ctx.len()];
    for (e, o) in out.iter_mut().enumerate() {
        decode_row(kv_b, first + e, &mut w);
        *o = dot16(&w, ctx);
    }
}

/// `q_abs = W_UKᵀ q_nope` (sum over the nope dimension in order; `deltafin_mla_absorb`).
pub fn absorb_query(q_nope: &[f32], w_uk: &[f32], q_abs: &mut [f32]) {
    let c = q_abs.len();
    q_abs.iter_mut().for_each(|v| *v = 0.0);
    for (dim, &qv) in q_nope.iter().enumerate() {
        for (a, &w) in q_abs.iter_mut().zip(&w_uk[dim * c..(dim + 1) * c]) {
            *a += qv * w;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Format;
    use crate::weights::Blob;

    /// A BF16 `kv_b_proj` of `heads × (nope + v)` rows of `c` values (xorshift bits, finite).
    fn kv_b(rows: usize, c: usize) -> Matrix {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let bytes = (0..rows * c)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Sign, exponent 2^-8 .. 2^7, random mantissa.
                let bits = ((x >> 48) as u16 & 0x807F) | ((0x77 + (x % 16) as u16) << 7);
                bits.to_le_bytes()
            })
            .collect();
        Matrix::new(Format::Bf16, rows, c, Blob::from_vec(bytes), None).unwrap()
    }

    /// Reading `kv_b_proj` as stored (decode steps) gives the bits of the decoded f32 copy
    /// (longer passes), for the absorbed query and the value projection alike.
    #[test]
    fn stored_and_decoded_kv_b_give_the_same_bits() {
        let (heads, nope, v, c) = (3, 24, 20, 40);
        let m = kv_b(heads * (nope + v), c);
        let mut wkv = vec![0.0f32; m.rows * m.cols];
        for (r, row) in wkv.chunks_mut(c).enumerate() {
            decode_row(&m, r, row);
        }
        let d = MlaDims {
            heads,
            nope,
            rope: 8,
            v,
            kv_lora: c,
            eps: 1e-6,
            scale: 0.1,
        };
        let q_nope: Vec<f32> = (0..nope).map(|i| (i as f32 * 0.37).sin()).collect();
        let ctx: Vec<f32> = (0..c).map(|i| (i as f32 * 0.61).cos()).collect();
        for h in 0..heads {
            let rows = &wkv[h * (nope + v) * c..(h + 1) * (nope + v) * c];
            let (mut a, mut b) = (vec![0.0; c], vec![0.0; c]);
            absorb_query(&q_nope, &rows[..nope * c], &mut a);
            absorb_query_stored(&m, h * (nope + v), &q_nope, &mut b);
            assert_eq!(
                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            let (mut a, mut b) = (vec![0.0; v], vec![0.0; v]);
            value_head(rows, &ctx, &d, &mut a);
            value_head_stored(&m, h * (nope + v) + nope, &ctx, &mut b);
            assert_eq!(
                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
