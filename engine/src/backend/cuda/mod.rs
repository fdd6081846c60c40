//! The CUDA backend (feature `cuda`): the matrix products of [`crate::backend::matmul`] on an
//! NVIDIA GPU through cudarc (driver API + NVRTC, both loaded at run time, so the crate builds
//! without a CUDA toolkit).
//!
//! * **Same bits as the CPU.** The kernels (`matmul.cu`, compiled at start-up with
//!   `--fmad=false --ftz=false`) follow the canonical 16-lane order of [`crate::kernels`], so a
//!   product on the GPU is bit-identical to the CPU kernels and the scalar reference, for every
//!   format and every row count. Everything else (attention, norms, routing, sampling) stays on
//!   the CPU, so a model produces the same tokens and logits on either device.
//! * **Weights as shipped.** A matrix is uploaded in its stored format (BF16, FP8 with scales,
//!   INT4 with scales, MXFP4 with E8M0 scales) and decoded inside the kernel, never re-encoded.
//!   Uploads are kept under a byte budget by [`Residency`] (the spine first, routed experts in
//!   a segmented LRU below it), keyed
//!   by the [`crate::weights::BlobKey`]s of the matrix bytes, which name immutable bytes.
//! * **Uploads overlap compute.** A matrix goes up through pinned staging buffers on a copy
//!   stream of its own (`staging.rs`), so the next routed expert's transfer runs under the
//!   products queued before it.
//! * **Failure keeps the answer.** If the device fails mid-run (a driver error, out of memory)
//!   the backend logs it once, stops using the device and computes the same product on the CPU,
//!   which is bit-identical; [`BackendStats::cpu_fallbacks`] counts those calls.

mod device_ops;
mod measure;
mod staging;

pub use device_ops::GpuBuf;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

use super::BackendStats;
use super::abi::{KERNELS, LAYER_KERNELS, LayerLaunch, LayerParams, kernel_args};
use super::residency::{Admit, Residency, WeightClass};
use crate::error::{Error, Result};
use crate::kernels::format::Matrix;
use crate::weights::BlobKey;

/// The kernel source, compiled for the device at start-up as one module: the matrix kernels,
/// the device math and the layer kernels.
const SOURCE: &str = concat!(
    include_str!("matmul.cu"),
    include_str!("math.cuh"),
    include_str!("layers.cu"),
    include_str!("deepseek.cu")
);
/// Output rows per thread block and input rows per register tile (as in `matmul.cu`).
const ROWS_PER_BLOCK: u32 = 16;
const TILE: usize = 8;
/// Largest grid y dimension; larger row counts are launched in chunks.
const MAX_GRID_Y: usize = 65_535;
/// Device memory left free for the activation buffers and the driver when no budget is given.
const DEFAULT_HEADROOM: f64 = 0.10;

type MatrixKey = (BlobKey, Option<BlobKey>);

/// A matrix's bytes on the device, in the stored format.
struct DeviceMatrix {
    data: CudaSlice<u8>,
    scales: Option<CudaSlice<u8>>,
}

/// Mutable state, one call at a time (the compute stream, and the copy stream of the uploads).
struct State {
    residency: Residency<MatrixKey>,
    weights: HashMap<MatrixKey, DeviceMatrix>,
    /// Weight uploads through pinned staging on a copy stream; `None`: synchronous on the
    /// compute stream (no pinned memory could be had).
    uploads: Option<staging::Uploads>,
    x: Option<CudaSlice<f32>>,
    y: Option<CudaSlice<f32>>,
    stats: BackendStats,
}

/// An opened GPU with its compiled kernels and resident weights.
pub struct CudaBackend {
    ordinal: usize,
    label: String,
    stream: Arc<CudaStream>,
    /// The format kernels, indexed like [`KERNELS`].
    kernels: Vec<CudaFunction>,
    /// The layer kernels, indexed like [`LAYER_KERNELS`].
    layer_kernels: Vec<CudaFunction>,
    state: Mutex<State>,
    failed: AtomicBool,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.label)
    }
}

fn device_error(ordinal: usize, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Device {
        device: format!("cuda:{ordinal}"),
        reason: format!("{what}: {e}"),
    }
}

impl CudaBackend {
    /// Open GPU `ordinal`, compile the kernels and set the weight budget (`memory` bytes, or 90%
    /// of the memory free now).
    pub fn open(ordinal: usize, memory: Option<u64>) -> Result<CudaBackend> {
        // SAFETY: only probes whether the shared libraries can be loaded (cudarc would panic on
        // first use otherwise); it has no other effect.
        #[allow(unsafe_code)]
        let (driver, nvrtc) = unsafe {
            (
                cudarc::driver::sys::is_culib_present(),
                cudarc::nvrtc::sys::is_culib_present(),
            )
        };
        if !driver {
            return Err(device_error(
                ordinal,
                "no CUDA driver",
                "libcuda.so cannot be loaded (install the NVIDIA driver; on Kubernetes use the NVIDIA \
                 container toolkit, e.g. runtimeClassName: nvidia)",
            ));
        }
        if !nvrtc {
            return Err(device_error(
                ordinal,
                "no NVRTC",
                "libnvrtc.so cannot be loaded (it ships with the CUDA runtime; the deltafin CUDA image \
                 includes it)",
            ));
        }
        let count = CudaContext::device_count().map_err(|e| device_error(ordinal, "driver", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(device_error(
                ordinal,
                "no such device",
                format!("{count} CUDA device(s) visible"),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| device_error(ordinal, "context", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| device_error(ordinal, "device query", e))?;
        let name = ctx.name().map_err(|e| device_error(ordinal, "device query", e))?;
        let (free, total) = ctx
            .mem_get_info()
            .map_err(|e| device_error(ordinal, "memory query", e))?;
        let budget = memory.unwrap_or((free as f64 * (1.0 - DEFAULT_HEADROOM)) as u64);
        let (kernels, layer_kernels) = compile(&ctx, ordinal, major, minor)?;
        let uploads = staging::Uploads::new(&ctx)
            .inspect_err(|e| {
                tracing::warn!(
                    device = ordinal,
                    error = %e,
                    "no pinned staging buffers or copy stream: weight uploads are synchronous"
                );
            })
            .ok();
        let label = format!(
            "cuda:{ordinal} {name} (sm_{major}{minor}, {:.1} GiB, weight budget {:.1} GiB)",
            total as f64 / (1u64 << 30) as f64,
            budget as f64 / (1u64 << 30) as f64
        );
        Ok(CudaBackend {
            ordinal,
            label,
            stream: ctx.default_stream(),
            kernels,
            layer_kernels,
            state: Mutex::new(State {
                residency: Residency::new(budget),
                weights: HashMap::new(),
                uploads,
                x: None,
                y: None,
                stats: BackendStats::default(),
            }),
            failed: AtomicBool::new(false),
        })
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// What this backend runs on.
    pub fn describe(&self) -> String {
        self.label.clone()
    }

    /// Counters since start.
    pub fn stats(&self) -> BackendStats {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        BackendStats {
            resident_bytes: s.residency.used(),
            expert_resident_bytes: s.residency.used_by(WeightClass::Expert),
            ..s.stats
        }
    }

    /// The byte budget for resident weights (`--device-memory`).
    pub fn weight_budget(&self) -> u64 {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.residency.budget()
    }

    /// Take `bytes` off the weight budget for other device memory (a served model's attention
    /// caches), evicting weights as [`Residency::reserve`] decides.
    pub fn reserve(&self, bytes: u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let evict = state.residency.reserve(bytes);
        state.stats.evictions += evict.len() as u64;
        for k in &evict {
            state.weights.remove(k);
        }
    }

    /// [`crate::backend::matmul`] on the GPU (bit-identical), or on the CPU once the device
    /// has failed.
    pub fn matmul(&self, m: &Matrix, x: &[f32], n: usize, y: &mut [f32], class: WeightClass) {
        assert_eq!(x.len(), n * m.cols, "x must hold n rows of cols");
        assert_eq!(y.len(), n * m.rows, "y must hold n rows of rows");
        if n == 0 || m.rows == 0 {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.stats.calls += 1;
        if !self.failed.load(Ordering::Relaxed) {
            match self.try_matmul(&mut state, (m, class), x, n, y) {
                Ok(()) => return,
                Err(e) => {
                    self.failed.store(true, Ordering::Relaxed);
                    tracing::error!(
                        device = %self.label,
                        error = %e,
                        "CUDA failed; computing on the CPU from now on (bit-identical results)"
                    );
                }
            }
        }
        state.stats.cpu_fallbacks += 1;
        drop(state);
        crate::kernels::cpu::matmul(m, x, n, y);
    }

    /// Run one layer kernel on the device over `bufs` (each buffer's bytes, in the kernel's
    /// order; an empty one is a null address), copying them in and back: the on-device check of
    /// `layers.cu` against the CPU (`engine/tests/cuda.rs`).
    pub fn run_layer(&self, l: &LayerLaunch, bufs: &mut [Vec<u8>]) -> Result<()> {
        use crate::backend::device::DeviceOps;
        let device: Vec<GpuBuf> = bufs
            .iter()
            .map(|b| DeviceOps::upload(self, b))
            .collect::<Result<_>>()?;
        let refs: Vec<Option<&GpuBuf>> = device.iter().map(Some).collect();
        DeviceOps::layer(self, l, &refs)?;
        for (b, d) in bufs.iter_mut().zip(&device) {
            *b = DeviceOps::download(self, d)?;
        }
        Ok(())
    }

    fn try_matmul(
        &self,
        state: &mut State,
        (m, class): (&Matrix, WeightClass),
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) -> std::result::Result<(), DriverError> {
        let key = (m.data.key(), m.scales.as_ref().map(|s| s.key()));
        let temporary = self.resident(state, &key, m, class)?;
        let State {
            weights,
            x: xs,
            y: ys,
            ..
        } = state;
        let xs = grow(&self.stream, xs, x.len().max(1))?;
        self.stream.memcpy_htod(x, xs)?;
        let ys = grow(&self.stream, ys, y.len())?;
        let dm = temporary.as_ref().unwrap_or_else(|| &weights[&key]);
        {
            let (xp, _x) = cudarc::driver::DevicePtr::device_ptr(&*xs, &self.stream);
            let (yp, _y) = cudarc::driver::DevicePtr::device_ptr(&*ys, &self.stream);
            self.launch_matmul(dm, m, (xp, yp), n)?;
        }
        self.stream.memcpy_dtoh(&ys.slice(0..y.len()), y)?;
        self.stream.synchronize()
    }

    /// Launch the product of `dm` (the device copy of `m`) with `n` rows at device address
    /// `x` (at least `n * cols` f32) into `y` (at least `n * rows` f32), on the stream.
    fn launch_matmul(
        &self,
        dm: &DeviceMatrix,
        m: &Matrix,
        (x, y): (u64, u64),
        n: usize,
    ) -> std::result::Result<(), DriverError> {
        let too_big = || DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE);
        let rows = i32::try_from(m.rows).map_err(|_| too_big())?;
        let cols = i32::try_from(m.cols).map_err(|_| too_big())?;
        let n_i32 = i32::try_from(n).map_err(|_| too_big())?;
        let args = kernel_args(m.format);
        let func = &self.kernels[args.code as usize];
        let (p0, p1, sdt) = (args.p0, args.p1, args.scale_dtype);
        let scales = dm.scales.as_ref().unwrap_or(&dm.data);
        let mut i_base = 0usize;
        while i_base < n {
            let here = (n - i_base).min(MAX_GRID_Y * TILE);
            let base = i_base as i32;
            let cfg = LaunchConfig {
                grid_dim: (
                    m.rows.div_ceil(ROWS_PER_BLOCK as usize) as u32,
                    here.div_ceil(TILE) as u32,
                    1,
                ),
                block_dim: (16, ROWS_PER_BLOCK, 1),
                shared_mem_bytes: 0,
            };
            let mut launch = self.stream.launch_builder(func);
            launch
                .arg(&dm.data)
                .arg(scales)
                .arg(&x)
                .arg(&y)
                .arg(&rows)
                .arg(&cols)
                .arg(&n_i32)
                .arg(&base)
                .arg(&p0)
                .arg(&p1)
                .arg(&sdt);
            // SAFETY: the argument list matches `DELTAFIN_MATMUL` in matmul.cu (three device
            // pointers, the output pointer, seven ints; `x` and `y` are device addresses passed
            // by value); `data`/`scales` hold exactly the bytes `Matrix::new` validated for this
            // format and shape, the caller guarantees `x` holds at least n * cols floats and `y`
            // at least n * rows, and the kernel reads and writes only inside those bounds (rows,
            // cols, n and i_base guard every index).
            #[allow(unsafe_code)]
            unsafe { launch.launch(cfg) }?;
            i_base += here;
        }
        Ok(())
    }

    /// Make `key` resident (uploading and evicting as [`Residency`] decides); returns the
    /// matrix itself when it is too large to keep and was uploaded for this call only.
    fn resident(
        &self,
        state: &mut State,
        key: &MatrixKey,
        m: &Matrix,
        class: WeightClass,
    ) -> std::result::Result<Option<DeviceMatrix>, DriverError> {
        let expert = class == WeightClass::Expert;
        match state.residency.admit(key, m.nbytes() as u64, class) {
            Admit::Hit => {
                state.stats.weight_hits += 1;
                state.stats.expert_hits += expert as u64;
                Ok(None)
            }
            Admit::Bypass => {
                state.stats.expert_uploads += expert as u64;
                state.stats.weight_uploads += 1;
                state.stats.weight_upload_bytes += m.nbytes() as u64;
                self.upload(&mut state.uploads, m).map(Some)
            }
            Admit::Insert { evict } => {
                for k in &evict {
                    state.weights.remove(k);
                }
                state.stats.evictions += evict.len() as u64;
                match self.upload(&mut state.uploads, m) {
                    Ok(dm) => {
                        state.stats.expert_uploads += expert as u64;
                        state.stats.weight_uploads += 1;
                        state.stats.weight_upload_bytes += m.nbytes() as u64;
                        state.weights.insert(*key, dm);
                        Ok(None)
                    }
                    Err(e) => {
                        state.residency.forget(key);
                        Err(e)
                    }
                }
            }
        }
    }

    /// `m`'s stored bytes on the device: through the staging ring on the copy stream (the
    /// compute stream waits for them where a product reads them), else synchronously.
    fn upload(
        &self,
        uploads: &mut Option<staging::Uploads>,
        m: &Matrix,
    ) -> std::result::Result<DeviceMatrix, DriverError> {
        let mut copy = |bytes: &[u8]| match uploads {
            Some(u) => u.upload(bytes),
            None => self.stream.clone_htod(bytes),
        };
        Ok(DeviceMatrix {
            data: copy(&m.data[..])?,
            scales: m.scales.as_ref().map(|s| copy(&s[..])).transpose()?,
        })
    }
}

/// A device buffer of at least `len` floats, reallocated (larger) when too small.
fn grow<'a>(
    stream: &Arc<CudaStream>,
    slot: &'a mut Option<CudaSlice<f32>>,
    len: usize,
) -> std::result::Result<&'a mut CudaSlice<f32>, DriverError> {
    if slot.as_ref().is_none_or(|s| s.len() < len) {
        *slot = None;
        *slot = Some(stream.alloc_zeros::<f32>(len.next_power_of_two())?);
    }
    Ok(slot.as_mut().expect("just allocated"))
}

type Kernels = (Vec<CudaFunction>, Vec<CudaFunction>);

/// Compile [`SOURCE`] for the device's architecture; load the matrix and the layer kernels.
fn compile(ctx: &Arc<CudaContext>, ordinal: usize, major: i32, minor: i32) -> Result<Kernels> {
    let opts = CompileOptions {
        ftz: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(false),
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some("deltafin_matmul.cu".into()),
        ..Default::default()
    };
    let ptx =
        compile_ptx_with_opts(SOURCE, opts).map_err(|e| device_error(ordinal, "kernel compilation", e))?;
    let module = ctx
        .load_module(ptx)
        .map_err(|e| device_error(ordinal, "kernel load", e))?;
    let load = |names: &[&str]| -> Result<Vec<CudaFunction>> {
        names
            .iter()
            .map(|name| {
                module
                    .load_function(name)
                    .map_err(|e| device_error(ordinal, name, e))
            })
            .collect()
    };
    Ok((load(&KERNELS)?, load(&LAYER_KERNELS)?))
}

// SAFETY: `LayerParams` is `#[repr(C)]` plain data (u64, i32 and f32 arrays) with the layout of
// `struct LayerParams` in layers.cu, so its bytes are a valid by-value kernel argument.
#[allow(unsafe_code)]
unsafe impl DeviceRepr for LayerParams {}
