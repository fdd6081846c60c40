//! The kernel benchmark behind `deltafin bench kernels` (a library function; the CLI only parses
//! options and prints the report). It measures, in a rayon pool of the requested size:
//!
//! * a memory-bandwidth probe: a multi-threaded SIMD read-sum over a buffer far larger than the
//!   last-level cache;
//! * effective GB/s of [`matmul_with`] (weight bytes read / time) per format and shape, cycling
//!   over enough distinct matrices that the working set is far larger than the L3, so weights
//!   come from DRAM; reported as a fraction of the probe;
//! * the multi-row kernel at `n = 2, 4, 8` input rows as time relative to `n = 1`.
//!
//! With [`BenchOptions::cache_hot`] the matrices instead stay in the L2 caches (two per format,
//! together three quarters of the threads' L2, each call long enough that the hand-off to the
//! pool is a few per cent of it), so each figure is the kernel's compute ceiling: a format below
//! 1.0 of the probe there cannot reach memory bandwidth on this CPU whatever the memory does.
//!
//! With [`BenchOptions::backend`] the products run on the process's backend instead (a GPU:
//! weights resident on the device after the warm-up, activations copied per call), and GB/s is
//! weight bytes per second on that device; the probe still measures host memory.
//!
//! Weight contents are pseudo-random but deterministic and always valid codes (no FP8 NaN codes,
//! FP8 scales around 1e-2, E8M0 exponents near 127).

use std::fmt;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde::Serialize;

use crate::kernels::cpu::{Isa, matmul_with, read_sum};
use crate::kernels::format::{Format, Matrix, ScaleDtype};
use crate::weights::Blob;

/// A benchmarked weight format with the layout parameters of the real checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchFormat {
    F32,
    Bf16,
    /// E4M3 with 128 x 128 f32 block scales (DeepSeek-V3).
    Fp8,
    /// Pack-quantized INT4, group 32, bf16 scales (Kimi-K2).
    Int4,
    /// MXFP4, group 32, E8M0 scales (Kimi K3 experts).
    Mxfp4,
}

impl BenchFormat {
    /// Every format, in report order.
    pub const ALL: [BenchFormat; 5] = [
        BenchFormat::F32,
        BenchFormat::Bf16,
        BenchFormat::Fp8,
        BenchFormat::Int4,
        BenchFormat::Mxfp4,
    ];

    /// Lower-case name, as accepted by [`BenchFormat::parse`].
    pub fn name(self) -> &'static str {
        match self {
            BenchFormat::F32 => "f32",
            BenchFormat::Bf16 => "bf16",
            BenchFormat::Fp8 => "fp8",
            BenchFormat::Int4 => "int4",
            BenchFormat::Mxfp4 => "mxfp4",
        }
    }

    /// The format named `s` (case-insensitive), if any.
    pub fn parse(s: &str) -> Option<BenchFormat> {
        BenchFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
    }

    fn format(self) -> Format {
        match self {
            BenchFormat::F32 => Format::F32,
            BenchFormat::Bf16 => Format::Bf16,
            BenchFormat::Fp8 => Format::Fp8Block {
                block_rows: 128,
                block_cols: 128,
            },
            BenchFormat::Int4 => Format::Int4Group {
                group: 32,
                scale: ScaleDtype::Bf16,
            },
            BenchFormat::Mxfp4 => Format::Mxfp4 { group: 32 },
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Threads of the rayon pool everything runs in (probe included).
    pub threads: usize,
    /// ISA of the kernels and the probe (`None`: the best detected).
    pub isa: Option<Isa>,
    /// Minimum wall time per measurement.
    pub min_time: Duration,
    /// Minimum calls (probe passes) per measurement.
    pub min_iters: usize,
    /// Size of the bandwidth probe's buffer.
    pub probe_bytes: usize,
    /// Minimum total bytes of the distinct matrices cycled per (format, shape).
    pub working_set_bytes: usize,
    /// Formats to measure.
    pub formats: Vec<BenchFormat>,
    /// `(rows = out, cols = in)` shapes.
    pub shapes: Vec<(usize, usize)>,
    /// Measure the compute ceiling instead: per format one [`HOT_COLS`]-wide shape whose two
    /// matrices fill three quarters of the threads' L2 caches (`shapes` and
    /// `working_set_bytes` are then not used).
    pub cache_hot: bool,
    /// Input-row counts of the multi-row measurement (each compared with `n = 1`).
    pub batch_rows: Vec<usize>,
    /// Run the products on [`crate::backend::current`] rather than the CPU kernels of `isa`.
    pub backend: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            isa: None,
            min_time: Duration::from_millis(500),
            min_iters: 5,
            probe_bytes: 512 << 20,
            working_set_bytes: 256 << 20,
            formats: BenchFormat::ALL.to_vec(),
            shapes: vec![(7168, 2048), (2048, 7168)],
            cache_hot: false,
            batch_rows: vec![2, 4, 8],
            backend: false,
        }
    }
}

/// Row counts from which the report also prints the multi-row product's GFLOP/s.
const PREFILL_ROWS: usize = 16;

/// Input width of the cache-hot shapes (a dsv3/K3 expert's or attention projection's width).
pub const HOT_COLS: usize = 2048;

/// L2 bytes per core assumed where Linux does not report the size.
const HOT_L2_FALLBACK: usize = 1 << 20;

/// The cache-hot shape of `f` for `threads` threads with `l2` bytes of L2 each: two matrices of
/// [`HOT_COLS`] columns filling three quarters of the threads' L2 together, rows a multiple of
/// 16 per thread (each thread's share of the rows is whole tiles).
pub fn hot_shape(f: BenchFormat, threads: usize, l2: usize) -> (usize, usize) {
    let step = 16 * threads.max(1);
    let (data, scales) = f
        .format()
        .byte_sizes(step, HOT_COLS)
        .expect("bench shapes are valid");
    let step_bytes = data + scales.unwrap_or(0);
    let per_matrix = l2 * threads.max(1) * 3 / 8;
    ((per_matrix / step_bytes).max(1) * step, HOT_COLS)
}

/// Result of the memory-bandwidth probe.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    pub bytes: usize,
    pub passes: usize,
    pub seconds: f64,
    pub gb_per_s: f64,
}

/// One multi-row measurement.
#[derive(Debug, Clone, Serialize)]
pub struct BatchResult {
    pub n: usize,
    pub seconds_per_call: f64,
    /// Time per call relative to the `n = 1` call on the same matrices.
    pub ratio_vs_n1: f64,
    /// Multiply-adds × 2 per second (`2 · rows · cols · n / seconds_per_call`, in 10^9).
    pub gflop_per_s: f64,
}

/// One (format, shape) measurement.
#[derive(Debug, Clone, Serialize)]
pub struct KernelResult {
    pub format: BenchFormat,
    pub rows: usize,
    pub cols: usize,
    /// Weight bytes (data + scales) of one matrix.
    pub matrix_bytes: usize,
    /// Distinct matrices cycled (working set = `matrices * matrix_bytes`).
    pub matrices: usize,
    pub calls: usize,
    pub seconds_per_call: f64,
    /// Weight bytes read per second at `n = 1`.
    pub gb_per_s: f64,
    /// `gb_per_s` over the probe's bandwidth.
    pub fraction_of_probe: f64,
    pub batch: Vec<BatchResult>,
}

/// Everything [`run`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Where the products ran (`cpu (avx512)`, or the GPU's description).
    pub device: String,
    pub isa: Isa,
    pub threads: usize,
    pub probe: ProbeResult,
    pub kernels: Vec<KernelResult>,
    /// On a GPU: how weights go up ([`upload_figures`]).
    pub uploads: Option<UploadFigures>,
    /// Anything that deviated from the requested options.
    pub notes: Vec<String>,
}

/// How a GPU uploads weights (`CudaBackend::measure_uploads`): `count` copies of one matrix
/// (`format`, `shape`: rows × cols, `bytes` stored) from pageable memory synchronously and
/// through the pinned staging ring on the copy stream; then `rows`-row products over resident
/// copies (`compute_seconds`), the staged uploads alone (`upload_seconds`), and both with each
/// upload queued while the previous matrix's product runs (`both_seconds`).
#[derive(Debug, Clone, Serialize)]
pub struct UploadFigures {
    pub format: String,
    pub shape: (usize, usize),
    pub bytes: usize,
    pub count: usize,
    pub rows: usize,
    pub pageable_gb_per_s: f64,
    pub staged_gb_per_s: f64,
    pub compute_seconds: f64,
    pub upload_seconds: f64,
    pub both_seconds: f64,
}

impl UploadFigures {
    /// The share of the shorter of compute and uploads hidden under the other: 0 when they
    /// ran one after the other, 1 when the longer one alone set the time.
    pub fn overlap(&self) -> f64 {
        let hidden = self.compute_seconds + self.upload_seconds - self.both_seconds;
        (hidden
            / self
                .compute_seconds
                .min(self.upload_seconds)
                .max(f64::MIN_POSITIVE))
        .clamp(0.0, 1.0)
    }
}

impl fmt::Display for UploadFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |s: f64| s * 1e3;
        writeln!(
            f,
            "uploads ({} {}x{}, {:.1} MiB): pageable {:.1} GB/s, pinned staging {:.1} GB/s",
            self.format,
            self.shape.0,
            self.shape.1,
            self.bytes as f64 / (1 << 20) as f64,
            self.pageable_gb_per_s,
            self.staged_gb_per_s
        )?;
        writeln!(
            f,
            "{} products of {} rows: compute {:.2} ms, uploads {:.2} ms, both {:.2} ms (overlap {:.2})",
            self.count,
            self.rows,
            ms(self.compute_seconds),
            ms(self.upload_seconds),
            ms(self.both_seconds),
            self.overlap()
        )
    }
}

/// The upload figures of the installed backend for an FP8 matrix of DeepSeek-V3's routed-expert
/// shape (`None` on the CPU, which uploads nothing).
pub fn upload_figures() -> Option<crate::Result<UploadFigures>> {
    match crate::backend::current() {
        crate::backend::Backend::Cpu => None,
        #[cfg(feature = "cuda")]
        crate::backend::Backend::Cuda(c) => {
            let m = random_matrix(BenchFormat::Fp8, 2048, 7168, 99);
            Some(c.measure_uploads(&m, 16, 64))
        }
    }
}

/// Run the benchmark described by `opts`.
pub fn run(opts: &BenchOptions) -> BenchReport {
    let mut notes = Vec::new();
    let isa = match opts.isa {
        Some(i) if i.is_available() => i,
        Some(i) => {
            notes.push(format!("ISA {i} is not available; using {}", Isa::detected()));
            Isa::detected()
        }
        None => Isa::detected(),
    };
    let threads = opts.threads.max(1);
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(p) => Some(p),
        Err(e) => {
            notes.push(format!(
                "could not build a {threads}-thread pool ({e}); using the global pool"
            ));
            None
        }
    };
    let body = || {
        let probe = probe(isa, opts);
        let kernels = opts
            .formats
            .iter()
            .flat_map(|&f| shapes(opts, f).into_iter().map(move |s| (f, s)))
            .map(|(f, (rows, cols))| measure(isa, opts, f, rows, cols, probe.gb_per_s))
            .collect();
        (probe, kernels)
    };
    let (probe, kernels) = match &pool {
        Some(p) => p.install(body),
        None => body(),
    };
    let threads = pool
        .as_ref()
        .map_or(rayon::current_num_threads(), |p| p.current_num_threads());
    let (device, uploads) = if opts.backend {
        let uploads = match upload_figures() {
            Some(Ok(u)) => Some(u),
            Some(Err(e)) => {
                notes.push(format!("upload figures: {e}"));
                None
            }
            None => None,
        };
        (crate::backend::current().describe(), uploads)
    } else {
        (format!("cpu ({isa})"), None)
    };
    BenchReport {
        device,
        isa,
        threads,
        probe,
        kernels,
        uploads,
        notes,
    }
}

/// The shapes measured for `f` (in the pool, so [`rayon::current_num_threads`] is the pool's).
fn shapes(opts: &BenchOptions, f: BenchFormat) -> Vec<(usize, usize)> {
    if opts.cache_hot {
        let l2 = crate::kernels::cpu::l2_cache_bytes().unwrap_or(HOT_L2_FALLBACK);
        vec![hot_shape(f, rayon::current_num_threads(), l2)]
    } else {
        opts.shapes.clone()
    }
}

/// Call `f` until both `min_time` and `min_iters` are reached; returns (calls, seconds).
fn timed(opts: &BenchOptions, mut f: impl FnMut(usize)) -> (usize, f64) {
    let start = Instant::now();
    let mut calls = 0;
    while calls < opts.min_iters.max(1) || start.elapsed() < opts.min_time {
        f(calls);
        calls += 1;
    }
    (calls, start.elapsed().as_secs_f64())
}

/// Multi-threaded read-sum over a buffer of `opts.probe_bytes` (at least 64 MiB).
fn probe(isa: Isa, opts: &BenchOptions) -> ProbeResult {
    let bytes = opts.probe_bytes.max(64 << 20) / 4096 * 4096;
    let buf: Vec<u8> = 1.0f32.to_le_bytes().iter().copied().cycle().take(bytes).collect();
    let part = bytes.div_ceil(rayon::current_num_threads()).next_multiple_of(256);
    let pass = || buf.par_chunks(part).map(|c| read_sum(isa, c)).sum::<f32>();
    std::hint::black_box(pass());
    let (passes, seconds) = timed(opts, |_| {
        std::hint::black_box(pass());
    });
    ProbeResult {
        bytes,
        passes,
        seconds,
        gb_per_s: (bytes * passes) as f64 / seconds / 1e9,
    }
}

/// splitmix64 stream for deterministic weight bytes.
fn fill(seed: u64, len: usize, mut map: impl FnMut(u64) -> u8) -> Vec<u8> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            map(z ^ (z >> 31))
        })
        .collect()
}

/// A random matrix of valid codes.
fn random_matrix(f: BenchFormat, rows: usize, cols: usize, seed: u64) -> Matrix {
    let format = f.format();
    let (data_len, scale_len) = format.byte_sizes(rows, cols).expect("bench shapes are valid");
    let data = match f {
        // Little-endian floats with exponents near 1: the high byte is 0x3F/0xBF.
        BenchFormat::F32 | BenchFormat::Bf16 => {
            let size = if f == BenchFormat::F32 { 4 } else { 2 };
            let mut i = 0;
            fill(seed, data_len, |z| {
                i += 1;
                if i % size == 0 {
                    0x3F | (z as u8 & 0x80)
                } else {
                    z as u8
                }
            })
        }
        BenchFormat::Fp8 => fill(seed, data_len, |z| {
            if z as u8 & 0x7F == 0x7F { 0x7E } else { z as u8 }
        }),
        BenchFormat::Int4 | BenchFormat::Mxfp4 => fill(seed, data_len, |z| z as u8),
    };
    let scales = scale_len.map(|len| match f {
        BenchFormat::Fp8 => {
            let mut i = 0;
            fill(seed ^ 1, len, |z| {
                i += 1;
                let b = [0x0A, 0xD7, 0x23, 0x3C][(i - 1) % 4]; // 1e-2 as f32, low bits varied
                if (i - 1) % 4 < 2 { b ^ z as u8 } else { b }
            })
        }
        BenchFormat::Int4 => {
            let mut i = 0;
            fill(seed ^ 1, len, |z| {
                i += 1;
                if i % 2 == 0 { 0x3C } else { z as u8 } // bf16 ~1e-2
            })
        }
        _ => fill(seed ^ 1, len, |z| 120 + (z % 15) as u8),
    });
    Matrix::new(
        format,
        rows,
        cols,
        Blob::from_vec(data),
        scales.map(Blob::from_vec),
    )
    .expect("sizes come from byte_sizes")
}

/// Time `matmul_with` for one (format, shape) at `n = 1` and each batch size.
fn measure(
    isa: Isa,
    opts: &BenchOptions,
    f: BenchFormat,
    rows: usize,
    cols: usize,
    probe_gbs: f64,
) -> KernelResult {
    let one = random_matrix(f, rows, cols, 1);
    let matrix_bytes = one.nbytes();
    let count = if opts.cache_hot {
        2
    } else {
        opts.working_set_bytes.div_ceil(matrix_bytes.max(1)).max(2)
    };
    let mats: Vec<Matrix> = std::iter::once(one)
        .chain((1..count).map(|i| random_matrix(f, rows, cols, 1 + i as u64)))
        .collect();
    let n_max = opts.batch_rows.iter().copied().max().unwrap_or(1).max(1);
    let x: Vec<f32> = fill(7, n_max * cols, |z| z as u8)
        .iter()
        .map(|&b| b as f32 / 128.0 - 1.0)
        .collect();
    let mut y = vec![0.0f32; n_max * rows];
    let mut call = |n: usize, i: usize| {
        let (m, x, y) = (&mats[i % count], &x[..n * cols], &mut y[..n * rows]);
        if opts.backend {
            crate::backend::current().matmul(m, x, n, y, crate::backend::WeightClass::Spine);
        } else {
            matmul_with(isa, m, x, n, y);
        }
    };
    (0..count).for_each(|i| call(1, i)); // warm-up: page in every matrix
    let (calls, secs) = timed(opts, |i| call(1, i));
    let per_call = secs / calls as f64;
    let gb_per_s = (matrix_bytes * calls) as f64 / secs / 1e9;
    let batch = opts
        .batch_rows
        .iter()
        .map(|&n| {
            let (c, s) = timed(opts, |i| call(n, i));
            let seconds_per_call = s / c as f64;
            BatchResult {
                n,
                seconds_per_call,
                ratio_vs_n1: seconds_per_call / per_call,
                gflop_per_s: 2.0 * (rows * cols * n) as f64 / seconds_per_call / 1e9,
            }
        })
        .collect();
    KernelResult {
        format: f,
        rows,
        cols,
        matrix_bytes,
        matrices: count,
        calls,
        seconds_per_call: per_call,
        gb_per_s,
        fraction_of_probe: gb_per_s / probe_gbs,
        batch,
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.probe;
        writeln!(f, "kernel benchmark: {}, {} threads", self.device, self.threads)?;
        writeln!(
            f,
            "memory bandwidth probe: {} MiB x {} passes: {:.1} GB/s",
            p.bytes >> 20,
            p.passes,
            p.gb_per_s
        )?;
        let batch_hdr: String = self.kernels.first().map_or(String::new(), |k| {
            k.batch
                .iter()
                .map(|b| format!("{:>8}", format!("n={}", b.n)))
                .collect()
        });
        writeln!(
            f,
            "{:<6} {:>11} {:>9} {:>4} {:>9} {:>7} {:>7}{batch_hdr}",
            "format", "out x in", "MiB/mat", "mats", "n=1 ms", "GB/s", "of bw"
        )?;
        for k in &self.kernels {
            let ratios: String = k
                .batch
                .iter()
                .map(|b| format!(" {:>6.2}x", b.ratio_vs_n1))
                .collect();
            writeln!(
                f,
                "{:<6} {:>11} {:>9.1} {:>4} {:>9.3} {:>7.1} {:>6.1}%{ratios}",
                k.format.name(),
                format!("{}x{}", k.rows, k.cols),
                k.matrix_bytes as f64 / (1 << 20) as f64,
                k.matrices,
                k.seconds_per_call * 1e3,
                k.gb_per_s,
                k.fraction_of_probe * 100.0
            )?;
        }
        for k in &self.kernels {
            for b in k.batch.iter().filter(|b| b.n >= PREFILL_ROWS) {
                writeln!(
                    f,
                    "{} {}x{} n={}: {:.1} GFLOP/s",
                    k.format.name(),
                    k.rows,
                    k.cols,
                    b.n,
                    b.gflop_per_s
                )?;
            }
        }
        if let Some(u) = &self.uploads {
            write!(f, "{u}")?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_is_the_share_of_the_shorter_side_hidden() {
        let u = |compute, upload, both| UploadFigures {
            format: "Fp8".into(),
            shape: (2, 2),
            bytes: 4,
            count: 2,
            rows: 1,
            pageable_gb_per_s: 1.0,
            staged_gb_per_s: 2.0,
            compute_seconds: compute,
            upload_seconds: upload,
            both_seconds: both,
        };
        assert_eq!(u(10.0, 4.0, 14.0).overlap(), 0.0, "one after the other");
        assert_eq!(u(10.0, 4.0, 10.0).overlap(), 1.0, "the uploads hidden");
        assert_eq!(u(10.0, 4.0, 12.0).overlap(), 0.5);
        assert_eq!(u(10.0, 4.0, 20.0).overlap(), 0.0, "slower than serial: none");
        assert!(u(10.0, 4.0, 12.0).to_string().contains("overlap 0.50"));
    }

    #[test]
    fn hot_shapes_fill_three_quarters_of_the_l2_caches() {
        for f in BenchFormat::ALL {
            for (threads, l2) in [(1, 1 << 20), (2, 2 << 20), (16, 2 << 20)] {
                let (rows, cols) = hot_shape(f, threads, l2);
                assert_eq!(cols, HOT_COLS);
                assert_eq!(rows % (16 * threads), 0, "{f:?}: whole tiles per thread");
                let (data, scales) = f.format().byte_sizes(rows, cols).unwrap();
                let two = 2 * (data + scales.unwrap_or(0));
                let budget = l2 * threads * 3 / 4;
                assert!(two <= budget, "{f:?} x{threads}: {two} > {budget}");
                assert!(
                    two * 10 >= budget * 9,
                    "{f:?} x{threads}: {two} well below {budget}"
                );
            }
        }
    }
}
