//! Deterministic synthetic checkpoints written in the real on-disk formats (HF `config.json`,
//! safetensors shards with an index, tokenizer files). Used for tests that need specific shapes
//! or formats, benchmarks, and the built-in K3 preset (`builtin::Builtin::K3`). Their
//! weights are random: the text they produce is meaningless, but every code path is the one
//! real checkpoints take.

mod deepseek;
mod deepseek_v4;
mod dspark;
mod fill;
mod gqa;
mod kimi;
mod routing;
mod tokenizer;

pub use crate::rng::Rng;
pub use deepseek::{DeepseekSynth, DsaShape, ExpertFormat};
pub use deepseek_v4::DeepseekV4Synth;
pub use dspark::DSparkSynth;
pub use gqa::{GqaFamily, GqaMoeSynth};
pub use kimi::{KimiK3Synth, KimiSynth, KimiVariant};
pub use routing::{RoutingModel, RoutingShape};
pub use tokenizer::{
    K3_SPECIALS, KIMI_SPECIALS, TokenizerFlavor, write_byte_tokenizer, write_byte_tokenizer_flavor,
};
