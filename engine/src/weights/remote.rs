//! Weights that may not be local yet. A stream install (`deltafin setup --stream`) keeps every
//! non-expert byte on disk and fetches routed experts on first use; the engine stays free of
//! network code and sees only this trait: "make these bytes of this shard local, then I read
//! them". Implemented outside the engine (`deltafin-fetch` implements it over its stream store).
//!
//! Contract, relied on by the out-of-core expert store:
//! * `make_local` returns only once the bytes are durable and readable at the returned path, and
//!   never exposes a partly written range as local (`is_local` stays false until then);
//! * the returned file is the *same file* (inode) the shard was indexed from, even when the
//!   implementation has meanwhile published it under its final name (a rename), so readers that
//!   opened it once keep reading the right bytes; the caller checks this;
//! * implementations are called from engine threads, never from inside an async runtime, and
//!   may be called concurrently (for different or identical ranges).

use std::fmt::Debug;
use std::ops::Range;
use std::path::PathBuf;

use crate::error::Result;

/// A store that can make byte ranges of a checkpoint's shards local on demand.
pub trait RangeSource: Send + Sync + Debug {
    /// Whether every byte of `range` of shard `file` (its name relative to the model directory)
    /// is local now.
    fn is_local(&self, file: &str, range: &Range<u64>) -> bool;

    /// Make `range` of `file` local (fetching what is missing) and return the path of the file
    /// that holds it now. Fails with [`crate::Error::Remote`] when the bytes cannot be had.
    fn make_local(&self, file: &str, range: &Range<u64>) -> Result<PathBuf>;
}
