//! Blob sources used by the out-of-core stores: one that records which tensors a builder
//! touches (to lay out its reads), and one that serves tensors from a buffer read according to
//! such a layout.

use std::sync::{Arc, Mutex};

use super::spans::SpanLayout;
use crate::config::Checkpoint;
use crate::error::{Error, Result};
use crate::model::Loader;
use crate::sync::lock;
use crate::weights::{Blob, BlobSource, TensorInfo, WeightIndex};

/// Records every tensor asked for; serves the bytes from the memory map (never touched for
/// matrices, which are only wrapped, not read, while building).
#[derive(Debug, Default)]
pub struct RecordingSource {
    seen: Mutex<Vec<TensorInfo>>,
}

impl RecordingSource {
    /// The recorded tensors.
    pub fn take(&self) -> Vec<TensorInfo> {
        std::mem::take(&mut lock(&self.seen))
    }
}

impl BlobSource for RecordingSource {
    fn blob(&self, index: &WeightIndex, info: &TensorInfo) -> Result<Blob> {
        lock(&self.seen).push(info.clone());
        Ok(index.blob(info))
    }

    fn records_only(&self) -> bool {
        true
    }
}

/// Serves tensors from a buffer filled according to `layout`.
pub struct BufferSource<'a> {
    pub owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    pub layout: &'a SpanLayout,
    /// The blob id naming the bytes of this read set whichever buffer holds them (from
    /// [`Blob::reserve_ids`], one per expert or layer read again and again), or `None` for a
    /// fresh identity.
    pub identity: Option<u64>,
}

impl std::fmt::Debug for BufferSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferSource({} segments)", self.layout.segments.len())
    }
}

impl BlobSource for BufferSource<'_> {
    fn blob(&self, index: &WeightIndex, info: &TensorInfo) -> Result<Blob> {
        let range = self.layout.place(info).ok_or_else(|| Error::Safetensors {
            path: index.shard_path(info).to_path_buf(),
            reason: format!("tensor `{}` is outside the read set built for it", info.name),
        })?;
        Ok(match self.identity {
            Some(id) => Blob::identified(self.owner.clone(), range, id),
            None => Blob::new(self.owner.clone(), range),
        })
    }
}

/// Run `build` once against a recording loader and lay out the tensors it touched.
pub fn record<R>(
    index: &WeightIndex,
    spec: &Checkpoint,
    routed_experts: bool,
    build: impl FnOnce(&Loader<'_>) -> Result<R>,
) -> Result<SpanLayout> {
    let rec = RecordingSource::default();
    let ld = Loader::new(index, spec)
        .with_source(&rec)
        .with_routed_experts(routed_experts);
    build(&ld)?;
    Ok(SpanLayout::new(&rec.take(), super::spans::MERGE_GAP))
}
