//! Weight uploads that overlap compute: a matrix's bytes go through a ring of pinned (page-locked)
//! host buffers onto a copy stream of their own, so the PCIe transfer of the next routed expert
//! runs while the compute stream works through the products queued before it.
//!
//! Ordering is cudarc's event tracking (on once a second stream exists): the destination's write
//! event is recorded on the copy stream after its last chunk, and a kernel launched on the compute
//! stream with that buffer as an argument waits for it; freeing a buffer waits for the launches
//! that read it. Each staging buffer has its own event, recorded after the copy that reads it and
//! waited for before the host writes it again, so the ring bounds the pinned memory and never
//! overwrites bytes in flight.
//!
//! Pinned memory is a scarce resource in containers: when it cannot be allocated the backend
//! uploads synchronously on the compute stream, as before (`CudaBackend::open` logs it).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DriverError, PinnedHostSlice,
};

/// Bytes of one staging buffer, and how many the ring holds (32 MiB pinned in all).
const STAGE_BYTES: usize = 8 << 20;
const STAGES: usize = 4;

/// One pinned buffer and the event of the last copy that read it.
struct Stage {
    host: PinnedHostSlice<u8>,
    done: CudaEvent,
}

/// The copy stream and its staging ring.
pub struct Uploads {
    copy: Arc<CudaStream>,
    ring: Vec<Stage>,
    next: usize,
}

impl Uploads {
    /// A copy stream and [`STAGES`] pinned buffers of [`STAGE_BYTES`] on `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Uploads, DriverError> {
        let copy = ctx.new_stream()?;
        let ring = (0..STAGES)
            .map(|_| {
                // SAFETY: the buffer's bytes are unset until written; every copy reads only the
                // prefix the host wrote just before it (`upload`).
                #[allow(unsafe_code)]
                let host = unsafe { ctx.alloc_pinned::<u8>(STAGE_BYTES) }?;
                Ok(Stage {
                    host,
                    done: ctx.new_event(None)?,
                })
            })
            .collect::<Result<_, DriverError>>()?;
        Ok(Uploads { copy, ring, next: 0 })
    }

    /// `bytes` in a new device buffer, copied on the copy stream through the ring; returns as
    /// soon as the last chunk is queued (the compute stream waits for it where it reads it).
    pub fn upload(&mut self, bytes: &[u8]) -> Result<CudaSlice<u8>, DriverError> {
        // SAFETY: every byte of the new buffer is written by the copies below before any kernel
        // can read it (the write event is recorded after the last one).
        #[allow(unsafe_code)]
        let mut dst = unsafe { self.copy.alloc::<u8>(bytes.len().max(1)) }?;
        let (base, record) = dst.device_ptr_mut(&self.copy);
        for range in chunks(bytes.len(), STAGE_BYTES) {
            let at = self.next;
            self.next = (at + 1) % self.ring.len();
            let stage = &mut self.ring[at];
            stage.done.synchronize()?; // its previous copy has read it
            let host = &mut stage.host.as_mut_slice()?[..range.len()];
            host.copy_from_slice(&bytes[range.clone()]);
            // SAFETY: `host` is pinned memory that stays untouched until `done` (recorded right
            // after on the same stream) completes; the destination range lies inside `dst`,
            // allocated above with `bytes.len()` bytes.
            #[allow(unsafe_code)]
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    base + range.start as u64,
                    host,
                    self.copy.cu_stream(),
                )
            }?;
            stage.done.record(&self.copy)?;
        }
        drop(record); // the write event: after the last chunk
        Ok(dst)
    }
}

impl Uploads {
    /// Wait for every copy queued so far.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.copy.synchronize()
    }
}

/// The chunks of `len` bytes, `stage` at most each, in order (pure).
pub fn chunks(len: usize, stage: usize) -> impl Iterator<Item = Range<usize>> {
    let stage = stage.max(1);
    (0..len.div_ceil(stage)).map(move |i| i * stage..((i + 1) * stage).min(len))
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_cover_every_byte_once_in_order() {
        assert_eq!(chunks(0, 8).count(), 0);
        assert_eq!(chunks(8, 8).collect::<Vec<_>>(), vec![0..8]);
        assert_eq!(chunks(20, 8).collect::<Vec<_>>(), vec![0..8, 8..16, 16..20]);
        assert_eq!(chunks(3, 0).collect::<Vec<_>>(), vec![0..1, 1..2, 2..3]);
    }
}
