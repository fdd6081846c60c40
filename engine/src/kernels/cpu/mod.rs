//! Optimised CPU matrix kernels: instruction-set detection ([`Isa`]), the dispatcher
//! ([`matmul_with`]) that splits output rows over the rayon pool, and one file per ISA
//! (`avx512`, `avx2`, `neon`, `scalar`) implementing the shared loops of `driver`.
//!
//! Every ISA produces results bit-identical to [`crate::kernels::reference::matmul`]: the
//! canonical 16-lane order is fixed per output element, so neither the ISA, the thread count, the
//! row split nor the number of input rows `n` changes a single bit.

mod cache_size;
mod driver;
mod panel;
mod plan;
mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;

use std::fmt;
use std::sync::OnceLock;

use rayon::prelude::*;

use self::driver::Chunk;
use self::plan::Plan;
use crate::kernels::LANES;
use crate::kernels::format::Matrix;

/// This CPU's L2 cache per core in bytes, as Linux reports it (`None` where it does not).
pub fn l2_cache_bytes() -> Option<usize> {
    cache_size::l2_bytes()
}

/// A CPU instruction set the kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Isa {
    /// Portable code (any target).
    Scalar,
    /// x86-64 AVX2 + F16C + FMA: two 8-lane registers per canonical accumulator.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL: one 16-lane register.
    Avx512,
    /// aarch64 Advanced SIMD: four 4-lane registers.
    Neon,
}

impl Isa {
    /// The best ISA this CPU supports (detected once, then cached).
    pub fn detected() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            [Isa::Avx512, Isa::Avx2, Isa::Neon]
                .into_iter()
                .find(|i| i.is_available())
                .unwrap_or(Isa::Scalar)
        })
    }

    /// Every ISA this CPU can run, best first (always ends with [`Isa::Scalar`]).
    pub fn available() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar]
            .into_iter()
            .filter(|i| i.is_available())
            .collect()
    }

    /// Whether this CPU (and this build's target architecture) can run `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::Avx2::new().is_some(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::Avx512::new().is_some(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => neon::Neon::new().is_some(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Lane order of this ISA's nibble (INT4, MXFP4) decoders (see `driver::Simd::NIBBLE_LANES`).
    fn nibble_lanes(self) -> &'static [u8; LANES] {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &<avx512::Avx512 as driver::Simd>::NIBBLE_LANES,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => &<avx2::Avx2 as driver::Simd>::NIBBLE_LANES,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => &<neon::Neon as driver::Simd>::NIBBLE_LANES,
            _ => &<scalar::Scalar as driver::Simd>::NIBBLE_LANES,
        }
    }

    /// The tile width the inputs of a call of `n` rows on a plan of `kind` are packed in, if
    /// it takes the multi-row path (see `driver::packed_width`).
    fn packed_width(self, kind: plan::Kind, n: usize) -> Option<usize> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => driver::packed_width::<avx512::Avx512>(kind, n),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => driver::packed_width::<avx2::Avx2>(kind, n),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => driver::packed_width::<neon::Neon>(kind, n),
            _ => driver::packed_width::<scalar::Scalar>(kind, n),
        }
    }

    /// Lower-case name (`scalar`, `avx2`, `avx512`, `neon`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Multiply-adds below which a call stays on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;
/// Output rows per rayon task at most / at least (multiples of 4 keep register tiles full).
const TASK_ROWS_MIN: usize = 16;

/// `backend::matmul` on the best detected ISA.
pub fn matmul(m: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_with(Isa::detected(), m, x, n, y);
}

/// `y[i * m.rows + r] = dot(W[r, :], x[i * m.cols ..][.. m.cols])` for `i < n`, on `isa`.
///
/// Output rows are split over the current rayon pool (large calls only); the result is
/// bit-identical to [`crate::kernels::reference::matmul`] for every ISA, `n` and pool size.
///
/// # Panics
/// If `x`/`y` do not hold `n` rows of `m.cols`/`m.rows` values, or `isa` is not available on
/// this CPU (see [`Isa::is_available`]) — both caller bugs.
pub fn matmul_with(isa: Isa, m: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    assert_eq!(x.len(), n * m.cols, "x must hold n rows of cols");
    assert_eq!(y.len(), n * m.rows, "y must hold n rows of rows");
    assert!(isa.is_available(), "ISA {isa} is not available on this CPU");
    if n == 0 || m.rows == 0 {
        return;
    }
    let plan = Plan::new(m);
    let lanes = match plan.kind {
        plan::Kind::Int4 | plan::Kind::Mxfp4 => isa.nibble_lanes(),
        _ => &driver::IDENTITY_LANES,
    };
    let xs = pad_rows(x, n, m.cols, lanes, isa.packed_width(plan.kind, n));
    let threads = rayon::current_num_threads();
    if threads <= 1 || m.rows * m.cols * n < PARALLEL_MIN_MACS || m.rows < 2 * TASK_ROWS_MIN {
        let mut outs: Vec<&mut [f32]> = y.chunks_mut(m.rows).collect();
        run(isa, &plan, &xs, n, 0, m.rows, &mut outs);
        return;
    }
    let task_rows = (m.rows / (threads * 4)).max(TASK_ROWS_MIN).next_multiple_of(4);
    let tasks = m.rows.div_ceil(task_rows);
    let mut per_task: Vec<Vec<&mut [f32]>> = (0..tasks).map(|_| Vec::with_capacity(n)).collect();
    for yrow in y.chunks_mut(m.rows) {
        for (t, part) in yrow.chunks_mut(task_rows).enumerate() {
            per_task[t].push(part);
        }
    }
    per_task.into_par_iter().enumerate().for_each(|(t, mut outs)| {
        let r0 = t * task_rows;
        let r1 = (r0 + task_rows).min(m.rows);
        run(isa, &plan, &xs, n, r0, r1, &mut outs);
    });
}

/// Rows `r0..r1` on `isa` (availability already checked).
fn run(isa: Isa, p: &Plan, x: &[Chunk], n: usize, r0: usize, r1: usize, out: &mut [&mut [f32]]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::run(p, x, n, r0, r1, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::run(p, x, n, r0, r1, out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::run(p, x, n, r0, r1, out),
        _ => scalar::run(p, x, n, r0, r1, out),
    }
}

/// `n` rows of `cols` values copied into 64-byte-aligned chunks, each row zero-padded to a
/// multiple of 16 (the canonical padding); lane `l` of a chunk holds its canonical lane
/// `lanes[l]` (the weight decoder's lane order). The rows follow one another, or with
/// `packed = Some(w)` are packed in tiles of `w` rows (`panel::packed_at`).
fn pad_rows(x: &[f32], n: usize, cols: usize, lanes: &[u8; LANES], packed: Option<usize>) -> Vec<Chunk> {
    let cpr = cols.div_ceil(LANES);
    let len = packed.map_or(n * cpr, |w| n.div_ceil(w) * w * cpr);
    let mut out = vec![Chunk::default(); len];
    if cols == 0 {
        return out;
    }
    let identity = *lanes == driver::IDENTITY_LANES;
    for (i, row) in x.chunks_exact(cols).enumerate() {
        for (c, s) in row.chunks(LANES).enumerate() {
            let d = &mut out[packed.map_or(i * cpr + c, |w| panel::packed_at(i, c, cpr, w))];
            if identity {
                d.0[..s.len()].copy_from_slice(s);
                continue;
            }
            for (v, &c) in d.0.iter_mut().zip(lanes) {
                *v = s.get(usize::from(c)).copied().unwrap_or(0.0);
            }
        }
    }
    out
}

/// Sum of `data` read as f32 with `isa`'s widest loads: the memory-bandwidth probe's loop.
///
/// # Panics
/// If `isa` is not available on this CPU.
pub fn read_sum(isa: Isa, data: &[u8]) -> f32 {
    assert!(isa.is_available(), "ISA {isa} is not available on this CPU");
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::read_sum(data),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::read_sum(data),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::read_sum(data),
        _ => scalar::read_sum(data),
    }
}
