//! The upload figures of `deltafin bench kernels --device cuda` ([`UploadFigures`]): copy
//! bandwidth from pageable memory (the synchronous path) and through the pinned staging ring,
//! and how much of the uploads of a stream of routed experts hides under their products.

use std::time::Instant;

use cudarc::driver::{DevicePtr, DriverError};

use super::{CudaBackend, DeviceMatrix, device_error};
use crate::backend::bench::UploadFigures;
use crate::error::Result;
use crate::kernels::Matrix;

impl CudaBackend {
    /// Upload `count` copies of `m` and run a product of `rows` rows over each: alone, and each
    /// upload queued while the previous matrix's product runs (see [`UploadFigures`]).
    pub fn measure_uploads(&self, m: &Matrix, count: usize, rows: usize) -> Result<UploadFigures> {
        self.try_measure_uploads(m, count.max(2), rows.max(1))
            .map_err(|e| device_error(self.ordinal, "upload benchmark", e))?
            .ok_or_else(|| {
                device_error(
                    self.ordinal,
                    "upload benchmark",
                    "no pinned staging (see the log)",
                )
            })
    }

    fn try_measure_uploads(
        &self,
        m: &Matrix,
        count: usize,
        rows: usize,
    ) -> std::result::Result<Option<UploadFigures>, DriverError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(up) = state.uploads.as_mut() else {
            return Ok(None);
        };
        let (data, scales) = (&m.data[..], m.scales.as_deref());
        let bytes = m.nbytes();
        let gbs = |secs: f64| (bytes * count) as f64 / secs / 1e9;
        let t = Instant::now();
        for _ in 0..count {
            drop(self.stream.clone_htod(data)?);
        }
        self.stream.synchronize()?;
        let pageable = t.elapsed().as_secs_f64();
        let staged = |up: &mut super::staging::Uploads| -> std::result::Result<DeviceMatrix, DriverError> {
            Ok(DeviceMatrix {
                data: up.upload(data)?,
                scales: scales.map(|s| up.upload(s)).transpose()?,
            })
        };
        let t = Instant::now();
        let held: Vec<DeviceMatrix> = (0..count)
            .map(|_| staged(up))
            .collect::<std::result::Result<_, _>>()?;
        up.synchronize()?;
        let upload_seconds = t.elapsed().as_secs_f64();
        let x = self.stream.alloc_zeros::<f32>(rows * m.cols)?;
        let y = self.stream.alloc_zeros::<f32>(rows * m.rows)?;
        let (xp, _x) = x.device_ptr(&self.stream);
        let (yp, _y) = y.device_ptr(&self.stream);
        let t = Instant::now();
        for dm in &held {
            self.launch_matmul(dm, m, (xp, yp), rows)?;
        }
        self.stream.synchronize()?;
        let compute_seconds = t.elapsed().as_secs_f64();
        drop(held);
        let t = Instant::now();
        let mut previous = staged(up)?;
        for _ in 1..count {
            let next = staged(up)?;
            self.launch_matmul(&previous, m, (xp, yp), rows)?;
            previous = next;
        }
        self.launch_matmul(&previous, m, (xp, yp), rows)?;
        self.stream.synchronize()?;
        let both_seconds = t.elapsed().as_secs_f64();
        Ok(Some(UploadFigures {
            format: format!("{:?}", m.format),
            shape: (m.rows, m.cols),
            bytes,
            count,
            rows,
            pageable_gb_per_s: gbs(pageable),
            staged_gb_per_s: gbs(upload_seconds),
            compute_seconds,
            upload_seconds,
            both_seconds,
        }))
    }
}
