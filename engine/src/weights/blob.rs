//! `Blob`: a cheap-to-clone, immutable byte range over a shared owner (a memory-mapped shard,
//! an owned buffer, or a cache slot). Kernels borrow `&[u8]` from it.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

/// An immutable byte range kept alive by a shared owner.
#[derive(Clone)]
pub struct Blob {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Blob {
    /// A blob covering `range` of `owner`. Panics if the range is out of bounds (a caller bug:
    /// ranges come from a validated index).
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= (*owner).as_ref().len(),
            "blob range out of bounds"
        );
        Blob { owner, range }
    }

    /// A blob owning a vector.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Blob {
            owner: Arc::new(bytes),
            range: 0..len,
        }
    }

    /// A sub-range of this blob (relative offsets).
    pub fn slice(&self, range: Range<usize>) -> Blob {
        assert!(
            range.start <= range.end && range.end <= self.range.len(),
            "blob slice out of bounds"
        );
        Blob {
            owner: self.owner.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        }
    }
}

impl Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

impl AsRef<[u8]> for Blob {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.range.len())
    }
}
