//! The model core, below both the architectures (`arch`) and the residency machinery
//! (`cache`): typed access to checkpoint tensors ([`Loader`]) and the layers that
//! architectures are built from ([`layers`]: attention, the gated MLP, the routed MoE and its
//! [`layers::moe::ExpertProvider`]). Nothing here imports `arch` or `cache`, so the cache can
//! build and serve layers without depending on any architecture (`engine/tests/layering.rs`
//! keeps it so).

pub mod layers;
mod loader;
mod names;

pub use loader::{Loader, Naming, NormWeight};
