//! The launch interface of the CUDA kernels: which matrix kernel (`cuda/matmul.cu`) a stored
//! format uses and the integers it is passed, and the grid, block and [`LayerParams`] of each
//! layer kernel (`cuda/layers.cu`). Kept apart from the feature-gated backend so that the CPU
//! emulation of the kernel sources (`engine/tests/cuda_emulated*.rs`) launches them exactly as
//! the backend does.

use crate::kernels::{Format, ScaleDtype};

/// One kernel launch's format-dependent arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelArgs {
    /// Entry point in `matmul.cu`.
    pub name: &'static str,
    /// The kernel's index in the order f32, bf16, fp8, int4, mxfp4 (the `FMT_*` codes).
    pub code: i32,
    /// FP8: block rows; INT4 / MXFP4: group size.
    pub p0: i32,
    /// FP8: block columns.
    pub p1: i32,
    /// Scale element type (`SCALE_F32` 0, `SCALE_BF16` 1, `SCALE_F16` 2).
    pub scale_dtype: i32,
}

/// Every kernel entry point, indexed by [`KernelArgs::code`].
pub const KERNELS: [&str; 5] = [
    "deltafin_matmul_f32",
    "deltafin_matmul_bf16",
    "deltafin_matmul_fp8",
    "deltafin_matmul_int4",
    "deltafin_matmul_mxfp4",
];

/// The launch arguments for a matrix stored as `format`. Layout parameters are validated by
/// [`crate::kernels::Matrix::new`]; values beyond `i32` are rejected there by the caller.
pub fn kernel_args(format: Format) -> KernelArgs {
    let (code, p0, p1, scale_dtype) = match format {
        Format::F32 => (0, 0, 0, 0),
        Format::Bf16 => (1, 0, 0, 0),
        Format::Fp8Block {
            block_rows,
            block_cols,
        } => (2, block_rows as i32, block_cols as i32, 0),
        Format::Int4Group { group, scale } => {
            let sdt = match scale {
                ScaleDtype::F32 => 0,
                ScaleDtype::Bf16 => 1,
                ScaleDtype::F16 => 2,
            };
            (3, group as i32, 0, sdt)
        }
        Format::Mxfp4 { group } => (4, group as i32, 0, 0),
    };
    KernelArgs {
        name: KERNELS[code as usize],
        code,
        p0,
        p1,
        scale_dtype,
    }
}

/// Buffer, integer and float slots of [`LayerParams`] (`DF_BUFS`, `DF_INTS`, `DF_FLOATS` in
/// `cuda/layers.cu`).
pub const LAYER_BUFS: usize = 8;
pub const LAYER_INTS: usize = 12;
pub const LAYER_FLOATS: usize = 4;

/// The one by-value argument of every layer kernel in `cuda/layers.cu` (`struct LayerParams`):
/// device addresses of its buffers, then its integers and floats, in the order each kernel
/// documents.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerParams {
    pub buf: [u64; LAYER_BUFS],
    pub int: [i32; LAYER_INTS],
    pub float: [f32; LAYER_FLOATS],
}

/// One layer-kernel launch: entry point, grid and block, and the scalar arguments. The caller
/// supplies the buffers in the kernel's order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerLaunch {
    pub name: &'static str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub int: [i32; LAYER_INTS],
    pub float: [f32; LAYER_FLOATS],
}

/// Every layer kernel entry point in `cuda/layers.cu`.
pub const LAYER_KERNELS: [&str; 25] = [
    "deltafin_rms_norm",
    "deltafin_gated_act",
    "deltafin_add",
    "deltafin_route",
    "deltafin_combine",
    "deltafin_mla_attend",
    "deltafin_mla_partials",
    "deltafin_mla_merge",
    "deltafin_kda_conv",
    "deltafin_kda_l2",
    "deltafin_kda_gates",
    "deltafin_kda_recurrence",
    "deltafin_rope",
    "deltafin_mla_absorb",
    "deltafin_mla_values",
    "deltafin_mul_sigmoid",
    "deltafin_copy_rows",
    "deltafin_attn_res",
    "deltafin_gqa_attend",
    "deltafin_dsa_scores",
    "deltafin_dsa_topk",
    "deltafin_v4_attend",
    "deltafin_hyper_mixes",
    "deltafin_hyper_weights",
    "deltafin_hyper_expand",
];

/// Threads per block of the element-wise kernels and the router (`DF_THREADS`).
const THREADS: u32 = 256;
/// Rows per RMSNorm block (`DF_NORM_ROWS`), each on 16 lanes.
const NORM_ROWS: u32 = 16;

/// A launch of `blocks` blocks of `block` threads (at least one block).
fn launch(name: &'static str, blocks: usize, block: [u32; 3], ints: &[i32], floats: &[f32]) -> LayerLaunch {
    let mut l = LayerLaunch {
        name,
        grid: [blocks.max(1) as u32, 1, 1],
        block,
        int: [0; LAYER_INTS],
        float: [0.0; LAYER_FLOATS],
    };
    l.int[..ints.len()].copy_from_slice(ints);
    l.float[..floats.len()].copy_from_slice(floats);
    l
}

/// Blocks of [`THREADS`] for one thread per item.
fn per_thread(items: usize) -> usize {
    items.div_ceil(THREADS as usize)
}

/// RMSNorm of `rows` rows of `width` (buffers: x, weight, out, and optionally a gate: then
/// `out = (w·(x·inv))·σ(gate)`, KDA's gated norm with rows = tokens × heads).
pub fn rms_norm(rows: usize, width: usize, eps: f32) -> LayerLaunch {
    gated_rms_norm(rows, width, eps, false)
}

/// [`rms_norm`] with a gate buffer (fourth) of sigmoid (KDA) or, with `silu`, SiLU (gated
/// DeltaNet) activations multiplied in.
pub fn gated_rms_norm(rows: usize, width: usize, eps: f32, silu: bool) -> LayerLaunch {
    let block = [crate::kernels::LANES as u32, NORM_ROWS, 1];
    let blocks = rows.div_ceil(NORM_ROWS as usize);
    launch(
        "deltafin_rms_norm",
        blocks,
        block,
        &[rows as i32, width as i32, silu as i32],
        &[eps],
    )
}

/// `act(g, u)` over `count` elements (buffers: g, u, out).
pub fn gated_act(count: usize, act: crate::kernels::layer_spec::Activation) -> crate::Result<LayerLaunch> {
    use crate::kernels::layer_spec::Activation;
    let (kind, beta, linear) = match act {
        Activation::Silu => (0, 0.0, 0.0),
        Activation::Situ {
            beta,
            linear_beta: None,
        } => (1, beta, 0.0),
        Activation::Situ {
            beta,
            linear_beta: Some(l),
        } => (2, beta, l),
        Activation::ClampedSwiglu { alpha, limit } => (3, alpha, limit),
        Activation::ClampedSilu { limit } => (4, 0.0, limit),
    };
    Ok(launch(
        "deltafin_gated_act",
        per_thread(count),
        [THREADS, 1, 1],
        &[count as i32, kind],
        &[beta, linear],
    ))
}

/// `a + b` over `count` elements (buffers: a, b, out).
pub fn add(count: usize) -> LayerLaunch {
    launch(
        "deltafin_add",
        per_thread(count),
        [THREADS, 1, 1],
        &[count as i32],
        &[],
    )
}

/// Routing of `rows` rows of `experts` router logits (buffers: logits, bias or empty, ids (i32),
/// weights, scratch of [`route_scratch`] f32 values).
pub fn route(
    rows: usize,
    experts: usize,
    r: &crate::kernels::layer_spec::RouterConfig,
) -> crate::Result<LayerLaunch> {
    use crate::kernels::layer_spec::Scoring;
    let scoring = match r.scoring {
        Scoring::Sigmoid => 0,
        Scoring::Softmax => 1,
        Scoring::TopKSoftmax => 2,
        Scoring::SqrtSoftplus => {
            return Err(crate::Error::InvalidArgument {
                field: "device",
                reason: format!("the device router has no {:?} scoring", r.scoring),
            });
        }
    };
    let ints = [
        rows as i32,
        experts as i32,
        scoring,
        r.n_group as i32,
        r.topk_group as i32,
        r.top_k as i32,
        r.norm_topk_prob as i32,
    ];
    Ok(launch(
        "deltafin_route",
        per_thread(rows),
        [THREADS, 1, 1],
        &ints,
        &[r.scaling],
    ))
}

/// Whether [`route`] has the router's scoring (else the router runs on the host).
pub fn routes_on_device(r: &crate::kernels::layer_spec::RouterConfig) -> bool {
    !matches!(r.scoring, crate::kernels::layer_spec::Scoring::SqrtSoftplus)
}

/// f32 scratch values [`route`] needs.
pub fn route_scratch(rows: usize, experts: usize, n_group: usize) -> usize {
    rows * (3 * experts + n_group)
}

/// Widest head the grouped-query attention kernel holds (`16 · DF_GQA_PER_LANE`).
pub const GQA_MAX_HEAD_DIM: usize = 256;

/// Grouped-query attention of `rows` query rows over `heads` heads reading `kv_heads` key/value
/// heads of `head_dim` (buffers: queries `[rows, heads · head_dim]`, cached keys and values
/// `[positions, kv_heads · head_dim]`, per-head sink logits or empty, per row (first position,
/// end) as i32, out `[rows, heads · head_dim]`). A head wider than [`GQA_MAX_HEAD_DIM`] is
/// refused.
pub fn gqa_attend(
    rows: usize,
    (heads, kv_heads, head_dim): (usize, usize, usize),
    scale: f32,
) -> crate::Result<LayerLaunch> {
    if head_dim > GQA_MAX_HEAD_DIM {
        return Err(crate::Error::InvalidArgument {
            field: "head_dim",
            reason: format!("{head_dim} is wider than the CUDA attention kernel's {GQA_MAX_HEAD_DIM}"),
        });
    }
    let ints = [rows as i32, heads as i32, kv_heads as i32, head_dim as i32];
    Ok(per_row_head("deltafin_gqa_attend", (rows, heads), &ints, scale))
}

/// A launch of one 16-lane group per (row, head): grid (rows, heads), block (16).
fn per_row_head(name: &'static str, (rows, heads): (usize, usize), ints: &[i32], scale: f32) -> LayerLaunch {
    let mut l = launch(name, rows, [crate::kernels::LANES as u32, 1, 1], ints, &[scale]);
    l.grid[1] = heads.max(1) as u32;
    l
}

/// Largest latent width the MLA attention kernel holds (`16 · DF_MLA_PER_LANE`).
pub const MLA_MAX_LATENT: usize = 1024;

/// Absorbed MLA attention of `rows` query rows over `heads` heads (buffers: absorbed queries,
/// rotated queries, key latents, rope keys, per row (first key position, positions) as i32,
/// out `[rows, heads, latent]`). A latent wider than [`MLA_MAX_LATENT`] is refused.
pub fn mla_attend(
    rows: usize,
    heads: usize,
    latent: usize,
    rope: usize,
    scale: f32,
) -> crate::Result<LayerLaunch> {
    if latent > MLA_MAX_LATENT {
        return Err(crate::Error::InvalidArgument {
            field: "kv_lora_rank",
            reason: format!("{latent} is wider than the CUDA attention kernel's {MLA_MAX_LATENT}"),
        });
    }
    let ints = [rows as i32, heads as i32, latent as i32, rope as i32];
    Ok(per_row_head("deltafin_mla_attend", (rows, heads), &ints, scale))
}

/// Positions per attention block (`DF_MLA_BLOCK`, `latent_attention::BLOCK`).
pub const MLA_BLOCK: usize = crate::kernels::layer_spec::MLA_BLOCK;

/// Long caches, step 1 (`deltafin_mla_partials`): every (row, head, block) of `blocks` at once,
/// buffers as [`mla_attend`] with the partials `[rows, heads, blocks, latent + 2]` in place of
/// its output.
pub fn mla_partials(
    rows: usize,
    heads: usize,
    (latent, rope): (usize, usize),
    scale: f32,
    blocks: usize,
) -> crate::Result<LayerLaunch> {
    let mut l = mla_attend(rows, heads, latent, rope, scale)?;
    l.name = "deltafin_mla_partials";
    l.int[4] = blocks as i32;
    l.grid[2] = blocks.max(1) as u32;
    Ok(l)
}

/// Widest head DeepSeek-V4's attention kernel takes (`16 · DF_V4_PER_LANE`).
pub const V4_MAX_HEAD_DIM: usize = 512;

/// DeepSeek-V4's window and entry attention (`deltafin_v4_attend`) of `rows` rows of `heads`
/// heads of `hd` (buffers: queries, window keys, entries, rows `[rows, 4]` (i32: first window
/// row, window keys, offset in the chosen list, chosen entries), chosen (i32 entry rows), sinks,
/// out `[rows, heads, hd]`).
pub fn v4_attend(rows: usize, heads: usize, hd: usize, scale: f32) -> crate::Result<LayerLaunch> {
    if hd > V4_MAX_HEAD_DIM {
        return Err(crate::Error::InvalidArgument {
            field: "head_dim",
            reason: format!("{hd} is wider than the CUDA V4 attention kernel's {V4_MAX_HEAD_DIM}"),
        });
    }
    let ints = [rows as i32, heads as i32, hd as i32];
    let block = [crate::kernels::LANES as u32, 1, 1];
    let mut l = launch("deltafin_v4_attend", rows, block, &ints, &[scale]);
    l.grid[1] = heads.max(1) as u32;
    Ok(l)
}

/// Threads per block of [`dsa_topk`] (`DF_TOPK_THREADS`).
const TOPK_THREADS: u32 = 256;

/// DeepSeek Sparse Attention's top-k (`deltafin_dsa_topk`) of `rows` rows of scores (buffers:
/// scores `[rows, stride]`, rows `[rows, 2]` (i32: first key position, keys scored), out
/// `[rows, k]` (i32 positions ascending, -1 past a row's count)).
pub fn dsa_topk(rows: usize, stride: usize, k: usize) -> LayerLaunch {
    let ints = [rows as i32, stride as i32, k as i32];
    launch("deltafin_dsa_topk", rows, [TOPK_THREADS, 1, 1], &ints, &[])
}

/// DeepSeek Sparse Attention's index scores (`deltafin_dsa_scores`) of `rows` rows with
/// `heads` heads of `d` values over at most `stride` keys each (buffers: rotated queries, scaled
/// head weights, keys, per row (first key, keys) as i32, out `[rows, stride]`); `scale` is
/// `d^-½`.
pub fn dsa_scores(rows: usize, (heads, d): (usize, usize), stride: usize, scale: f32) -> LayerLaunch {
    index_scores(rows, (heads, d), stride, scale, 0)
}

/// DeepSeek-V4's indexer scores (`deltafin_dsa_scores` in V4's order: 16-lane dots, relu, scale,
/// head weight, summed from -0; `compressed::index_scores`), buffers as [`dsa_scores`].
pub fn v4_index_scores(rows: usize, (heads, d): (usize, usize), stride: usize, scale: f32) -> LayerLaunch {
    index_scores(rows, (heads, d), stride, scale, 1)
}

fn index_scores(
    rows: usize,
    (heads, d): (usize, usize),
    stride: usize,
    scale: f32,
    order: i32,
) -> LayerLaunch {
    let ints = [rows as i32, heads as i32, d as i32, stride as i32, order];
    let mut l = launch(
        "deltafin_dsa_scores",
        per_thread(stride),
        [THREADS, 1, 1],
        &ints,
        &[scale],
    );
    l.grid[1] = rows.max(1) as u32;
    l
}

/// Long caches, step 2 (`deltafin_mla_merge`; buffers: partials, rows, out): the partials of
/// [`mla_partials`] folded per (row, head) in ascending block order.
pub fn mla_merge(rows: usize, heads: usize, latent: usize, blocks: usize) -> LayerLaunch {
    let ints = [rows as i32, heads as i32, latent as i32, blocks as i32];
    let mut l = launch(
        "deltafin_mla_merge",
        rows,
        [crate::kernels::LANES as u32, 1, 1],
        &ints,
        &[],
    );
    l.grid[1] = heads.max(1) as u32;
    l
}

/// Weighted combine of routed outputs into `rows` rows of `width` (buffers: results, weights,
/// offsets (i32, `rows + 1`), out).
pub fn combine(rows: usize, width: usize) -> LayerLaunch {
    launch(
        "deltafin_combine",
        per_thread(rows * width),
        [THREADS, 1, 1],
        &[rows as i32, width as i32],
        &[],
    )
}

/// KDA convolution + SiLU of a pass's rows, `seqs` sequences of `width` (= 3P) raw channels and
/// convolution width `kernel` (buffers: raw, conv weights, histories (advanced), sequence row
/// offsets (i32), row ids (i32), out).
pub fn kda_conv(seqs: usize, width: usize, kernel: usize) -> LayerLaunch {
    let ints = [seqs as i32, width as i32, kernel as i32];
    let mut l = launch(
        "deltafin_kda_conv",
        per_thread(width),
        [THREADS, 1, 1],
        &ints,
        &[],
    );
    l.grid[1] = seqs.max(1) as u32;
    l
}

/// KDA q/k L2 norms in place over `n` rows (buffer: the convolved `[n, 3P]`).
pub fn kda_l2(
    n: usize,
    heads: usize,
    head_dim: usize,
    l2: crate::kernels::layer_spec::L2Norm,
    q_scale: f32,
) -> LayerLaunch {
    use crate::kernels::layer_spec::L2Norm;
    let (mode, eps) = match l2 {
        L2Norm::EpsInside(e) => (0, e),
        L2Norm::EpsFloor(e) => (1, e),
    };
    let ints = [n as i32, heads as i32, head_dim as i32, mode];
    launch(
        "deltafin_kda_l2",
        per_thread(n * 2 * heads),
        [THREADS, 1, 1],
        &ints,
        &[eps, q_scale],
    )
}

/// KDA log-decay and β of `n` rows of `channels` (buffers: f, dt_bias, rate, β logits, g out,
/// β out); `f` holds one value per `group` channels (1: KDA; the head width: gated DeltaNet).
pub fn kda_gates(
    n: usize,
    (channels, group): (usize, usize),
    heads: usize,
    decay: crate::config::KdaDecay,
) -> LayerLaunch {
    use crate::config::KdaDecay;
    let (kind, bound) = match decay {
        KdaDecay::Softplus => (0, 0.0),
        KdaDecay::LowerBound(b) => (1, b),
    };
    let ints = [n as i32, channels as i32, heads as i32, kind, group as i32];
    launch(
        "deltafin_kda_gates",
        per_thread(n * channels),
        [THREADS, 1, 1],
        &ints,
        &[bound],
    )
}

/// Largest KDA head width the recurrence kernel holds (one thread per state column).
pub const KDA_MAX_HEAD_DIM: usize = 1024;

/// KDA delta rule and read-out of `seqs` sequences (buffers: states (advanced), normalised qkv,
/// g, β, sequence row offsets (i32), row ids (i32), out). A head wider than
/// [`KDA_MAX_HEAD_DIM`] is refused.
pub fn kda_recurrence(seqs: usize, heads: usize, head_dim: usize) -> crate::Result<LayerLaunch> {
    if head_dim > KDA_MAX_HEAD_DIM {
        return Err(crate::Error::InvalidArgument {
            field: "head_dim",
            reason: format!("{head_dim} is wider than the CUDA KDA kernel's {KDA_MAX_HEAD_DIM}"),
        });
    }
    let ints = [seqs as i32, heads as i32, head_dim as i32];
    let mut l = launch(
        "deltafin_kda_recurrence",
        seqs,
        [head_dim.max(1) as u32, 1, 1],
        &ints,
        &[],
    );
    l.grid[1] = heads.max(1) as u32;
    Ok(l)
}

/// Where the vectors RoPE rotates lie: `vecs` per row, the row's stride, the first vector's
/// offset in the row and the stride between vectors (all in f32 values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeLayout {
    pub vecs: usize,
    pub row_stride: usize,
    pub offset: usize,
    pub vec_stride: usize,
}

/// Largest rotary width the RoPE kernel holds.
pub const ROPE_MAX_DIM: usize = 512;

/// RoPE in place on `rows` rows laid out as `at`, `dim` wide, by host-computed factors
/// (buffers: x, factors `[rows, dim]`). A width above [`ROPE_MAX_DIM`] is refused.
pub fn rope(rows: usize, at: RopeLayout, dim: usize, interleave: bool) -> crate::Result<LayerLaunch> {
    rope_form(rows, at, dim, interleave as i32)
}

/// [`rope`] on interleaved pairs kept in place (DeepSeek-V4's `compressed::rotate`; the factors'
/// sines negated rotate back).
pub fn rope_pairs(rows: usize, at: RopeLayout, dim: usize) -> crate::Result<LayerLaunch> {
    rope_form(rows, at, dim, 2)
}

fn rope_form(rows: usize, at: RopeLayout, dim: usize, form: i32) -> crate::Result<LayerLaunch> {
    if dim > ROPE_MAX_DIM {
        return Err(crate::Error::InvalidArgument {
            field: "qk_rope_head_dim",
            reason: format!("{dim} is wider than the CUDA RoPE kernel's {ROPE_MAX_DIM}"),
        });
    }
    let ints = [
        rows as i32,
        at.vecs as i32,
        at.row_stride as i32,
        at.offset as i32,
        at.vec_stride as i32,
        (dim / 2) as i32,
        form,
    ];
    Ok(launch(
        "deltafin_rope",
        per_thread(rows * at.vecs),
        [THREADS, 1, 1],
        &ints,
        &[],
    ))
}

/// The integers of the two MLA projection kernels: n, heads, nope, rope, v, kv_lora.
fn mla_ints(n: usize, d: &crate::kernels::layer_spec::MlaDims) -> [i32; 6] {
    [n, d.heads, d.nope, d.rope, d.v, d.kv_lora].map(|v| v as i32)
}

/// Absorbed and rotated query parts of `n` rows (buffers: q, decoded kv_b, q_abs out, q_rope
/// out).
pub fn mla_absorb(n: usize, d: &crate::kernels::layer_spec::MlaDims) -> LayerLaunch {
    let span = d.kv_lora.max(d.rope);
    launch(
        "deltafin_mla_absorb",
        per_thread(n * d.heads * span),
        [THREADS, 1, 1],
        &mla_ints(n, d),
        &[],
    )
}

/// Attention values of `n` rows from their latent contexts (buffers: decoded kv_b, contexts,
/// out).
pub fn mla_values(n: usize, d: &crate::kernels::layer_spec::MlaDims) -> LayerLaunch {
    let [n32, heads, nope, _, v, c] = mla_ints(n, d);
    let block = [crate::kernels::LANES as u32, NORM_ROWS, 1];
    let blocks = (n * d.heads * d.v).div_ceil(NORM_ROWS as usize);
    launch(
        "deltafin_mla_values",
        blocks,
        block,
        &[n32, heads, nope, v, c],
        &[],
    )
}

/// `a · σ(g)` over `count` elements (buffers: a, g, out).
pub fn mul_sigmoid(count: usize) -> LayerLaunch {
    launch(
        "deltafin_mul_sigmoid",
        per_thread(count),
        [THREADS, 1, 1],
        &[count as i32],
        &[],
    )
}

/// Rows of a row copy: their stride and the first column copied (in f32 values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSlice {
    pub stride: usize,
    pub col: usize,
}

/// Copy `count` rows of `width` values from `src` to `dst` (buffers: src, dst, source row ids
/// (i32) or empty for 0.., destination row ids or empty for 0..).
pub fn copy_rows(count: usize, width: usize, src: RowSlice, dst: RowSlice) -> LayerLaunch {
    let ints = [count, width, src.stride, src.col, dst.stride, dst.col].map(|v| v as i32);
    launch(
        "deltafin_copy_rows",
        per_thread(count * width),
        [THREADS, 1, 1],
        &ints,
        &[],
    )
}

/// Most values (anchors and the partial sum) one AttnRes mix takes on the GPU (`DF_RES_MAX`).
pub const ATTN_RES_MAX_VALUES: usize = 64;

/// K3's Block Attention Residual mix of `rows` rows of `width` over `count` stacked values
/// (buffers: values `[count, rows, width]`, pseudo-query, out). More than
/// [`ATTN_RES_MAX_VALUES`] values are refused.
pub fn attn_res(rows: usize, width: usize, count: usize, eps: f32) -> crate::Result<LayerLaunch> {
    if count > ATTN_RES_MAX_VALUES {
        return Err(crate::Error::InvalidArgument {
            field: "attn_res_block_size",
            reason: format!("{count} blocks is more than the CUDA AttnRes kernel's {ATTN_RES_MAX_VALUES}"),
        });
    }
    let block = [crate::kernels::LANES as u32, NORM_ROWS, 1];
    let blocks = rows.div_ceil(NORM_ROWS as usize);
    let ints = [rows as i32, width as i32, count as i32];
    Ok(launch("deltafin_attn_res", blocks, block, &ints, &[eps]))
}

/// Most hyper-connection streams the kernels take (`DF_HC_MAX`).
pub const HYPER_MAX_STREAMS: usize = 8;

fn hyper_streams(streams: usize) -> crate::Result<()> {
    match streams {
        1..=HYPER_MAX_STREAMS => Ok(()),
        _ => Err(crate::Error::InvalidArgument {
            field: "hc_mult",
            reason: format!(
                "{streams} hyper-connection streams (the CUDA kernels take 1 to {HYPER_MAX_STREAMS})"
            ),
        }),
    }
}

/// A hyper-connection site's (or head's) mixes of `rows` rows of `width` stream values through
/// `mixes` projection rows (buffers: streams, projection, out `[rows, mixes]`).
pub fn hyper_mixes(rows: usize, width: usize, mixes: usize, eps: f32) -> LayerLaunch {
    let mut l = launch(
        "deltafin_hyper_mixes",
        rows,
        [crate::kernels::LANES as u32, 1, 1],
        &[rows as i32, width as i32, mixes as i32],
        &[eps],
    );
    l.grid[1] = mixes.max(1) as u32;
    l
}

/// The weights and collapse of `rows` rows of `streams` streams of `hidden` (buffers: mixes,
/// base then scales, streams, weights out (a site's; none for the head), collapsed out);
/// `head`: the hyper head's collapse (its weights are `pre` only).
pub fn hyper_weights(
    rows: usize,
    (streams, hidden): (usize, usize),
    (iters, head): (usize, bool),
    eps: f32,
) -> crate::Result<LayerLaunch> {
    hyper_streams(streams)?;
    let ints = [
        rows as i32,
        hidden as i32,
        streams as i32,
        iters as i32,
        head as i32,
    ];
    Ok(launch(
        "deltafin_hyper_weights",
        rows,
        [THREADS, 1, 1],
        &ints,
        &[eps],
    ))
}

/// The expand of `rows` rows of `streams` streams of `hidden` (buffers: weights, the
/// sub-layer's output, streams, out).
pub fn hyper_expand(rows: usize, streams: usize, hidden: usize) -> crate::Result<LayerLaunch> {
    hyper_streams(streams)?;
    let ints = [rows as i32, hidden as i32, streams as i32];
    Ok(launch(
        "deltafin_hyper_expand",
        per_thread(rows * streams * hidden),
        [THREADS, 1, 1],
        &ints,
        &[],
    ))
}
