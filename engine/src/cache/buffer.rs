//! Page-aligned buffers: the memory of resident weights, streamed spine arenas and expert
//! cache slots. Aligned so that `O_DIRECT` reads can land in them directly. Each is its own
//! anonymous private mapping: zero pages are supplied lazily by the kernel (allocating a
//! large cache costs nothing until slots are filled) and dropping a buffer returns its memory
//! to the system at once (no allocator keeps it).
//!
//! Invariant (upheld by the owners, not by this type): bytes are written through
//! [`AlignedBuf::write_ptr`] only while no `&[u8]` view of the same buffer exists. The reader
//! pool writes only into buffers whose owner has handed out no view (a loading cache slot, an
//! arena slot with no outstanding `Blob`), and views are created only after the write finished.

use std::fmt;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of buffers, file offsets and lengths for direct I/O.
pub const ALIGN: usize = 4096;

/// Transparent huge page size on x86-64 and most aarch64 kernels: buffers this large are
/// hinted to use them.
const HUGE_PAGE: usize = 2 << 20;

/// Round `n` up to a multiple of [`ALIGN`].
pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN as u64) * ALIGN as u64
}

/// Round `n` down to a multiple of [`ALIGN`].
pub fn align_down(n: u64) -> u64 {
    n / ALIGN as u64 * ALIGN as u64
}

/// A zero-initialised, [`ALIGN`]-aligned buffer of fixed length (an anonymous mapping).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain heap memory owned by this value. Shared access follows the
// module invariant (no concurrent write and view of the same bytes), which the owners enforce
// with their slot state machines.
#[allow(unsafe_code)]
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` only exposes reads through `as_ref` and a raw write pointer
// whose use is governed by the module invariant.
#[allow(unsafe_code)]
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `len` bytes (rounded up to [`ALIGN`]). Pages are allocated lazily by the OS.
    pub fn new(len: usize) -> Result<Self> {
        let len = (align_up(len.max(1) as u64)) as usize;
        // SAFETY: an anonymous private mapping with no address hint and no file; the result is
        // checked against MAP_FAILED before use.
        #[allow(unsafe_code)]
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(Error::Budget(format!(
                "could not map {len} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| Error::Budget(format!("could not map {len} bytes")))?;
        if len >= HUGE_PAGE {
            // Weights are streamed through once per pass: with 4 KiB pages every page is a TLB
            // miss. Where transparent huge pages are `madvise`-only (a common default), ask
            // for them; a hint, so a kernel without them just ignores it.
            // SAFETY: the range is the mapping just created, owned by this value.
            #[allow(unsafe_code)]
            unsafe {
                libc::madvise(raw, len, libc::MADV_HUGEPAGE)
            };
        }
        Ok(AlignedBuf { ptr, len })
    }

    /// Length in bytes (a multiple of [`ALIGN`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: the minimum is one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer for writers; see the module invariant.
    pub fn write_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised (zeroed, then possibly overwritten) bytes
        // that live as long as `self`; the module invariant rules out concurrent writes.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with exactly this length, unmapped once; no view outlives
        // `self` (views borrow it).
        #[allow(unsafe_code)]
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_rounded_up() {
        let b = AlignedBuf::new(5000).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.write_ptr() as usize % ALIGN, 0);
        assert!(b.as_ref().iter().all(|&x| x == 0));
        assert_eq!(align_up(4097), 8192);
        assert_eq!(align_down(4097), 4096);
    }
}
