//! Where the matrix products run: the process-wide [`Backend`] behind [`matmul`]. `Backend` is a
//! closed enum (CPU, and CUDA with the `cuda` feature); model code calls [`matmul`] and never
//! names a device. The kernels sit below this module and never call back into it.
//!
//! Every backend computes the canonical dot product of [`crate::kernels`] bit for bit, so the
//! choice of device changes speed, never output. The binary picks one at start-up
//! ([`Backend::open`] then [`install`]); until then, and in every library test, it is the CPU.

pub mod abi;
pub mod bench;
pub mod device;
pub mod residency;

#[cfg(feature = "cuda")]
pub mod cuda;

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::kernels::Matrix;
pub use residency::WeightClass;

/// `y[i * m.rows + r] = dot(W[r, :], x[i * m.cols ..][.. m.cols])` for `i < n`.
///
/// `x` holds `n` rows of `m.cols` f32 values and `y` receives `n` rows of `m.rows` values.
/// Reads each weight once for all `n` rows. Bit-identical to
/// [`crate::kernels::reference::matmul`]. Runs on the process's backend ([`current`]): by
/// default the best detected ISA ([`crate::kernels::Isa::detected`]) over the current rayon pool
/// (see [`crate::kernels::matmul_with`]), or a GPU.
pub fn matmul(m: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    current().matmul(m, x, n, y, WeightClass::Spine)
}

/// [`matmul`] for a routed expert's matrix: the same bits; a GPU keeps it in the expert tier
/// below the spine (see [`residency`]).
pub fn matmul_expert(m: &Matrix, x: &[f32], n: usize, y: &mut [f32]) {
    current().matmul(m, x, n, y, WeightClass::Expert)
}

/// A compute device named on the command line: `cpu`, `cuda` (GPU 0) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    #[default]
    Cpu,
    Cuda {
        ordinal: usize,
    },
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Device> {
        let bad = || Error::InvalidArgument {
            field: "device",
            reason: format!("`{s}` is not a device (expected `cpu`, `cuda` or `cuda:N`)"),
        };
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda { ordinal: 0 }),
            other => {
                let n = other.strip_prefix("cuda:").ok_or_else(bad)?;
                let ordinal = n.parse().map_err(|_| bad())?;
                Ok(Device::Cuda { ordinal })
            }
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// Counters of a backend since start (all zero for the CPU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct BackendStats {
    /// Matrix products run.
    pub calls: u64,
    /// Weight matrices copied to the device, and their bytes.
    pub weight_uploads: u64,
    pub weight_upload_bytes: u64,
    /// Products whose weights were already on the device.
    pub weight_hits: u64,
    /// Matrices dropped from the device to stay within its budget.
    pub evictions: u64,
    /// Weight bytes on the device now, and the part of them that are routed experts (the rest
    /// is the spine).
    pub resident_bytes: u64,
    pub expert_resident_bytes: u64,
    /// Routed-expert products whose weights were already on the device, and those that
    /// uploaded them.
    pub expert_hits: u64,
    pub expert_uploads: u64,
    /// Products computed on the CPU after the device failed.
    pub cpu_fallbacks: u64,
}

/// The device that runs [`matmul`].
#[derive(Debug)]
pub enum Backend {
    /// The CPU kernels (SIMD over the rayon pool).
    Cpu,
    /// An NVIDIA GPU.
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaBackend>),
}

impl Backend {
    /// Open `device`. `device_memory` caps the weight bytes a GPU keeps resident (default: 90%
    /// of its free memory). A device this build or machine cannot provide is an
    /// [`Error::Device`] saying why.
    pub fn open(device: Device, device_memory: Option<u64>) -> Result<Backend> {
        match device {
            Device::Cpu => Ok(Backend::Cpu),
            #[cfg(feature = "cuda")]
            Device::Cuda { ordinal } => {
                cuda::CudaBackend::open(ordinal, device_memory).map(|c| Backend::Cuda(Box::new(c)))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda { .. } => {
                let _ = device_memory;
                Err(Error::Device {
                    device: device.to_string(),
                    reason: "this deltafin was built without CUDA support (build with `--features cuda`, \
                             or use the -cuda image)"
                        .into(),
                })
            }
        }
    }

    /// `y[i * m.rows + r] = dot(W[r, :], x[i])` for `i < n` (see [`matmul`]); `class` is the
    /// matrix's tier on a device.
    pub fn matmul(&self, m: &Matrix, x: &[f32], n: usize, y: &mut [f32], class: WeightClass) {
        match self {
            Backend::Cpu => {
                let _ = class;
                crate::kernels::cpu::matmul(m, x, n, y)
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.matmul(m, x, n, y, class),
        }
    }

    /// The weight budget of a device (`None` on the CPU).
    pub fn weight_budget(&self) -> Option<u64> {
        match self {
            Backend::Cpu => None,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Some(c.weight_budget()),
        }
    }

    /// The device this backend runs on.
    pub fn device(&self) -> Device {
        match self {
            Backend::Cpu => Device::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => Device::Cuda { ordinal: c.ordinal() },
        }
    }

    /// A one-line description for logs and `--stats`.
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu => format!("cpu ({})", crate::kernels::Isa::detected()),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.describe(),
        }
    }

    /// Counters since start.
    pub fn stats(&self) -> BackendStats {
        match self {
            Backend::Cpu => BackendStats::default(),
            #[cfg(feature = "cuda")]
            Backend::Cuda(c) => c.stats(),
        }
    }
}

static CURRENT: OnceLock<Backend> = OnceLock::new();
static CPU: Backend = Backend::Cpu;

/// Make `backend` the process's backend for every product from now on (normally once, at
/// start-up; products already run on the CPU are unaffected, being bit-identical). Fails,
/// handing the backend back, if one was installed before.
pub fn install(backend: Backend) -> std::result::Result<&'static Backend, Backend> {
    let mut slot = Some(backend);
    let installed = CURRENT.get_or_init(|| slot.take().expect("taken once"));
    match slot {
        None => Ok(installed),
        Some(b) => Err(b),
    }
}

/// The process's backend (the CPU unless [`install`] chose another).
pub fn current() -> &'static Backend {
    CURRENT.get().unwrap_or(&CPU)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("CUDA".parse::<Device>().unwrap(), Device::Cuda { ordinal: 0 });
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda { ordinal: 3 });
        assert_eq!(Device::Cuda { ordinal: 3 }.to_string(), "cuda:3");
        for bad in ["", "tpu", "cuda:", "cuda:-1", "cuda:x"] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { field: "device", .. }),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_cpu_always_opens_and_reports_nothing() {
        let b = Backend::open(Device::Cpu, None).unwrap();
        assert!(b.describe().starts_with("cpu ("));
        assert_eq!(b.stats(), BackendStats::default());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_typed_error_naming_the_fix() {
        let e = Backend::open(Device::Cuda { ordinal: 0 }, None).unwrap_err();
        assert_eq!(e.kind(), "device");
        assert!(e.to_string().contains("--features cuda"), "{e}");
    }
}
