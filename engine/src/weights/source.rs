//! Where a tensor's bytes come from. By default a [`WeightIndex`] hands out `Blob`s over its
//! memory-mapped shards; a [`BlobSource`] lets a loader take the same tensors from elsewhere
//! (a resident buffer read at start, a streamed arena slot, an expert-cache slot) while the
//! architecture code that builds the layers stays the same.

use super::{Blob, TensorInfo, WeightIndex};
use crate::error::Result;

/// A provider of tensor bytes for an index's tensors.
pub trait BlobSource: Sync {
    /// The bytes of `info` (exactly `info.len` bytes).
    fn blob(&self, index: &WeightIndex, info: &TensorInfo) -> Result<Blob>;

    /// Whether this source only records which tensors are asked for, so the bytes it hands out
    /// may not be the tensor's (a stream install's remote experts read as holes). Loaders then
    /// skip checks on tensor *values*; they run when the layer is built from its real bytes.
    fn records_only(&self) -> bool {
        false
    }
}

/// The default source: the index's memory maps.
#[derive(Debug, Clone, Copy, Default)]
pub struct MappedSource;

impl BlobSource for MappedSource {
    fn blob(&self, index: &WeightIndex, info: &TensorInfo) -> Result<Blob> {
        Ok(index.blob(info))
    }
}
