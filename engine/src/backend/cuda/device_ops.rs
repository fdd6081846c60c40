//! [`DeviceOps`] on the GPU: buffers in device memory, the layer kernels and the matrix
//! products launched on the backend's stream in order, so a whole pass runs without a copy to
//! the host between operations (`model::layers::device`). Weights go through the same tiered
//! residency as [`CudaBackend::matmul`].

use cudarc::driver::{CudaSlice, DevicePtr, DriverError, LaunchConfig, PushKernelArg};

use super::{CudaBackend, device_error};
use crate::backend::WeightClass;
use crate::backend::abi::{LAYER_BUFS, LAYER_KERNELS, LayerLaunch, LayerParams};
use crate::backend::device::DeviceOps;
use crate::error::Result;
use crate::kernels::Matrix;

/// A device buffer and its length in bytes. The driver refuses empty allocations, so an empty
/// buffer holds one byte and is passed to kernels as a null address.
pub struct GpuBuf {
    slice: CudaSlice<u8>,
    len: usize,
}

impl std::fmt::Debug for GpuBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuBuf({} bytes)", self.len)
    }
}

impl GpuBuf {
    /// The device address, or 0 for an empty buffer.
    fn address(&self, backend: &CudaBackend) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(&backend.stream);
        if self.len == 0 { 0 } else { ptr }
    }
}

impl CudaBackend {
    fn fail(&self, what: &str) -> impl Fn(DriverError) -> crate::Error + '_ {
        let what = what.to_string();
        move |e| device_error(self.ordinal, &what, e)
    }
}

impl DeviceOps for CudaBackend {
    type Buf = GpuBuf;

    fn upload(&self, bytes: &[u8]) -> Result<GpuBuf> {
        let src = if bytes.is_empty() { &[0u8][..] } else { bytes };
        let slice = self.stream.clone_htod(src).map_err(self.fail("upload"))?;
        Ok(GpuBuf {
            slice,
            len: bytes.len(),
        })
    }

    fn zeros(&self, len: usize) -> Result<GpuBuf> {
        let slice = self
            .stream
            .alloc_zeros::<u8>(len.max(1))
            .map_err(self.fail("alloc"))?;
        Ok(GpuBuf { slice, len })
    }

    fn download(&self, buf: &GpuBuf) -> Result<Vec<u8>> {
        let mut out = vec![0u8; buf.len];
        if buf.len > 0 {
            let src = buf.slice.slice(0..buf.len);
            self.stream
                .memcpy_dtoh(&src, &mut out[..])
                .map_err(self.fail("download"))?;
        }
        self.stream.synchronize().map_err(self.fail("download"))?;
        Ok(out)
    }

    fn layer(&self, l: &LayerLaunch, bufs: &[Option<&GpuBuf>]) -> Result<()> {
        let index = LAYER_KERNELS.iter().position(|&n| n == l.name);
        let Some(func) = index.map(|i| &self.layer_kernels[i]) else {
            return Err(device_error(self.ordinal, "no such layer kernel", l.name));
        };
        if bufs.len() > LAYER_BUFS {
            return Err(device_error(self.ordinal, l.name, "too many buffers"));
        }
        let mut params = LayerParams {
            int: l.int,
            float: l.float,
            ..Default::default()
        };
        for (slot, b) in params.buf.iter_mut().zip(bufs) {
            *slot = b.map_or(0, |b| b.address(self));
        }
        let cfg = LaunchConfig {
            grid_dim: (l.grid[0], l.grid[1], l.grid[2]),
            block_dim: (l.block[0], l.block[1], l.block[2]),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(func);
        launch.arg(&params);
        // SAFETY: every layer kernel takes one `LayerParams` by value; its addresses are live
        // device buffers of the caller (freed, if at all, in stream order after this launch),
        // and `backend::abi` sized the grid and the integers from the same lengths the kernel
        // guards its indices with.
        #[allow(unsafe_code)]
        unsafe { launch.launch(cfg) }.map_err(self.fail(l.name))?;
        Ok(())
    }

    fn matmul(&self, m: &Matrix, class: WeightClass, x: &GpuBuf, n: usize, y: &GpuBuf) -> Result<()> {
        if x.len < 4 * n * m.cols || y.len < 4 * n * m.rows {
            return Err(device_error(
                self.ordinal,
                "matmul",
                "activation buffers too small",
            ));
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.stats.calls += 1;
        let key = (m.data.key(), m.scales.as_ref().map(|s| s.key()));
        let temporary = self
            .resident(&mut state, &key, m, class)
            .map_err(self.fail("upload"))?;
        let dm = temporary.as_ref().unwrap_or_else(|| &state.weights[&key]);
        self.launch_matmul(dm, m, (x.address(self), y.address(self)), n)
            .map_err(self.fail("matmul"))
    }
}
