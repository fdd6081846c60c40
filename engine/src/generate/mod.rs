//! Generation: per-sequence state, sampling, chunked prefill and decode with token streaming.

mod run;
mod sampling;
mod state;

pub use run::{FinishReason, Flow, Generation, GenerateOptions, GenerationStats, generate};
pub use sampling::{Sampling, sample, uniform};
pub use state::{KdaCache, KdaShape, LayerState, MlaCache, SeqState};
