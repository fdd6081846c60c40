//! A compute device as the layers see it when the whole forward pass runs there: buffers that
//! stay on the device, the layer kernels of `cuda/layers.cu` ([`super::abi`]) and the matrix
//! products. Model code written against [`DeviceOps`] (`model/layers/device.rs`) keeps every
//! activation and cache on the device and copies only the inputs in and the logits (and the
//! router's choices) out.
//!
//! The CUDA backend implements it on a GPU; the tests implement it with the CPU emulator of the
//! kernel sources, so the same orchestration is checked bit for bit against the CPU model in CI.

use super::WeightClass;
use super::abi::LayerLaunch;
use crate::error::Result;
use crate::kernels::Matrix;

/// The operations a device-resident forward pass needs.
///
/// Shared between threads: the out-of-core expert store hands routed experts to the device from
/// its threads, each launching its own expert's work (a GPU stream takes launches from any
/// thread, in the order they come).
pub trait DeviceOps: Sync {
    /// A buffer in device memory. Kernels write through shared references, as device memory is
    /// written by launches, not by the host.
    type Buf: Send + Sync;

    /// A copy of `bytes` on the device.
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf>;

    /// `len` zero bytes on the device.
    fn zeros(&self, len: usize) -> Result<Self::Buf>;

    /// The buffer's bytes, copied to the host.
    fn download(&self, buf: &Self::Buf) -> Result<Vec<u8>>;

    /// Run one layer kernel over `bufs` in the kernel's order (`None`: an absent optional
    /// buffer, passed as a null address).
    fn layer(&self, launch: &LayerLaunch, bufs: &[Option<&Self::Buf>]) -> Result<()>;

    /// `y = W x` for `n` rows: `x` holds `n × m.cols` f32, `y` receives `n × m.rows`; the
    /// weights are made resident as `class` ([`super::residency`]).
    fn matmul(&self, m: &Matrix, class: WeightClass, x: &Self::Buf, n: usize, y: &Self::Buf) -> Result<()>;

    /// f32 values uploaded.
    fn upload_f32(&self, v: &[f32]) -> Result<Self::Buf> {
        self.upload(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    /// i32 values uploaded.
    fn upload_i32(&self, v: &[i32]) -> Result<Self::Buf> {
        self.upload(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    /// `n` f32 zeros.
    fn zeros_f32(&self, n: usize) -> Result<Self::Buf> {
        self.zeros(4 * n)
    }

    /// The buffer's f32 values.
    fn download_f32(&self, buf: &Self::Buf) -> Result<Vec<f32>> {
        Ok(self
            .download(buf)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// A shared device is a device: a model session holds `&D` or owns `D` alike.
impl<T: DeviceOps + ?Sized> DeviceOps for &T {
    type Buf = T::Buf;

    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf> {
        (**self).upload(bytes)
    }

    fn zeros(&self, len: usize) -> Result<Self::Buf> {
        (**self).zeros(len)
    }

    fn download(&self, buf: &Self::Buf) -> Result<Vec<u8>> {
        (**self).download(buf)
    }

    fn layer(&self, launch: &LayerLaunch, bufs: &[Option<&Self::Buf>]) -> Result<()> {
        (**self).layer(launch, bufs)
    }

    fn matmul(&self, m: &Matrix, class: WeightClass, x: &Self::Buf, n: usize, y: &Self::Buf) -> Result<()> {
        (**self).matmul(m, class, x, n, y)
    }
}
