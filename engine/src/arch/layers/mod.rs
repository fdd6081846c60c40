//! Layers shared by architectures: MLA attention, RoPE, the gated MLP and the routed MoE.

pub mod mla;
pub mod mlp;
pub mod moe;
pub mod rope;
