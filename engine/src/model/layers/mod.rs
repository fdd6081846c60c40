//! Layers shared by architectures: MLA attention (dense, or sparse with the DSA indexer), KDA and gated-DeltaNet linear attention, Block Attention
//! Residuals, RoPE, the gated MLP (SiLU / SiTU) and the routed (optionally latent) MoE.

pub mod attn_res;
pub mod compressed;
pub mod device;
pub mod device_index;
pub mod device_v4;
pub mod dsa;
pub mod gated_deltanet;
pub mod gqa;
pub mod hyper;
pub mod kda;
pub mod latent_attention;
#[cfg(target_arch = "x86_64")]
mod latent_avx512;
pub mod mla;
pub mod mlp;
pub mod moe;
mod on_device;
pub mod ops;
pub mod rope;
