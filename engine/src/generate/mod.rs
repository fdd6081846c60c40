//! Generation: per-sequence state with staged passes that can be committed to a prefix or
//! rolled back (see [`SeqState`]), sampling, chunked prefill and decode with token streaming.

mod decode;
mod run;
mod sampling;

pub use crate::state::{KdaCache, KdaShape, KvCache, LayerState, MlaCache, SeqState};
pub use decode::{
    ConstraintFactory, DecodeOptions, Decoder, Pick, TokenConstraint, TokenLogprobs, logprobs_of,
};
pub use run::{
    FinishReason, Flow, GenerateOptions, Generation, GenerationStats, generate, generate_on_device,
    generate_with,
};
pub use sampling::{Sampling, sample, sample_filtered, uniform};
