//! `Blob`: a cheap-to-clone, immutable byte range over a shared owner (a memory-mapped shard,
//! an owned buffer, or a cache slot). Kernels borrow `&[u8]` from it.
//!
//! Every blob made by [`Blob::new`] or [`Blob::from_vec`] gets a fresh process-unique id, shared
//! by its clones and slices. Together with the range this is a [`BlobKey`]: two blobs with equal
//! keys view the same bytes, which never change while either exists (owners write a buffer only
//! while no blob views it, see `cache::buffer`). A device backend may therefore keep a copy of
//! the bytes under the key; bytes written into a reused buffer later are viewed by a new blob
//! with a new id, so a stale copy is never matched.
//!
//! Bytes read from a checkpoint again and again (a routed expert or a streamed layer out of
//! core, into whichever buffer is free) keep one identity across reads: their reader reserves
//! ids once ([`Blob::reserve_ids`]) and names each read's blob with its item's id
//! ([`Blob::identified`]). The checkpoint's bytes do not change (a read that does not match its
//! checksum is an error, not a blob), so a device copy kept under such a key stays valid however
//! often the host buffer is refilled.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// An immutable byte range kept alive by a shared owner.
#[derive(Clone)]
pub struct Blob {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
    id: u64,
}

/// Identity of the bytes a [`Blob`] views (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlobKey {
    id: u64,
    start: usize,
    len: usize,
}

/// The next unused blob id.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

impl Blob {
    /// A blob covering `range` of `owner`. Panics if the range is out of bounds (a caller bug:
    /// ranges come from a validated index).
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= (*owner).as_ref().len(),
            "blob range out of bounds"
        );
        Blob {
            owner,
            range,
            id: fresh_id(),
        }
    }

    /// A blob over `range` of `owner` holding the bytes named `id` (from [`Blob::reserve_ids`]):
    /// every blob so named views the same bytes, whichever buffer holds them (see the module
    /// docs). Panics if the range is out of bounds, as [`Blob::new`].
    pub fn identified(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>, id: u64) -> Self {
        Blob {
            id,
            ..Blob::new(owner, range)
        }
    }

    /// `count` consecutive ids, never handed out by [`Blob::new`] or [`Blob::from_vec`] nor
    /// reserved again: the first.
    pub fn reserve_ids(count: u64) -> u64 {
        NEXT_ID.fetch_add(count, Ordering::Relaxed)
    }

    /// A blob owning a vector.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Blob {
            owner: Arc::new(bytes),
            range: 0..len,
            id: fresh_id(),
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
            id: self.id,
        }
    }

    /// The identity of the bytes this blob views.
    pub fn key(&self) -> BlobKey {
        BlobKey {
            id: self.id,
            start: self.range.start,
            len: self.range.len(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_viewed_bytes() {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(vec![1u8, 2, 3, 4]);
        let a = Blob::new(owner.clone(), 0..4);
        assert_eq!(a.key(), a.clone().key(), "a clone views the same bytes");
        assert_eq!(a.slice(1..3).key(), a.slice(1..3).key());
        assert_ne!(
            a.slice(1..3).key(),
            a.slice(0..2).key(),
            "another range is other bytes"
        );
        let again = Blob::new(owner, 0..4);
        assert_ne!(
            a.key(),
            again.key(),
            "a new blob may view rewritten bytes: a new identity"
        );
        assert_ne!(Blob::from_vec(vec![0; 4]).key(), Blob::from_vec(vec![0; 4]).key());
    }

    #[test]
    fn named_bytes_keep_their_key_in_any_buffer() {
        let first = Blob::reserve_ids(2);
        let buffer = |v: u8| -> Arc<dyn AsRef<[u8]> + Send + Sync> { Arc::new(vec![v; 8]) };
        let a = Blob::identified(buffer(1), 2..6, first);
        let refilled = Blob::identified(buffer(1), 2..6, first);
        assert_eq!(a.key(), refilled.key(), "the same bytes read again");
        assert_eq!(a.slice(1..2).key(), refilled.slice(1..2).key());
        assert_ne!(a.key(), Blob::identified(buffer(1), 2..6, first + 1).key());
        assert_ne!(a.key(), Blob::identified(buffer(1), 0..4, first).key());
        let next = Blob::reserve_ids(1);
        assert!(next >= first + 2, "reserved ids are not handed out again");
        assert!(Blob::from_vec(vec![0]).key() != a.key());
    }
}
