//! Checkpoint weights: the safetensors index over every shard of a model directory, tensor
//! metadata (name -> file, byte range, dtype, shape) and shared byte buffers (`Blob`).
//! Tensors are never re-encoded here: kernels decode the stored format directly. Shards of a
//! stream install may be partly remote ([`RangeSource`]).

mod blob;
pub mod checksums;
mod dtype;
mod remote;
mod safetensors;
mod source;
mod stream;
mod writer;

pub use blob::{Blob, BlobKey};
pub use checksums::{Checksums, ShardSums};
pub use dtype::Dtype;
pub use remote::RangeSource;
pub use safetensors::{ShardFile, TensorInfo, WeightIndex};
pub use source::{BlobSource, MappedSource};
pub use stream::StreamWriter;
pub use writer::{TensorSpec, write_atomic, write_safetensors};
