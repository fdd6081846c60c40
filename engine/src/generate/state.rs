//! Per-sequence model state: one entry per layer (the MLA latent cache for attention layers).
//! The state only grows by committed rows; `truncate` rolls back to an earlier length.

/// The compressed MLA cache of one layer: the normalised latent `c_kv` and the rotated shared
/// key `k_rope` of every position (never expanded per head).
#[derive(Debug, Clone, Default)]
pub struct MlaCache {
    /// `len × kv_lora_rank` values.
    pub latent: Vec<f32>,
    /// `len × qk_rope_head_dim` values.
    pub k_rope: Vec<f32>,
}

/// State of one layer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LayerState {
    Mla(MlaCache),
}

/// Everything a sequence carries between passes.
#[derive(Debug, Clone)]
pub struct SeqState {
    pub(crate) layers: Vec<LayerState>,
    pub(crate) len: usize,
}

impl SeqState {
    /// A fresh state with the given layer states.
    pub fn new(layers: Vec<LayerState>) -> Self {
        SeqState { layers, len: 0 }
    }

    /// Number of positions already processed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position has been processed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forget every position at or after `len` (no-op if `len >= self.len()`).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for layer in &mut self.layers {
            match layer {
                LayerState::Mla(c) => {
                    let kv = c.latent.len() / self.len;
                    let rope = c.k_rope.len() / self.len;
                    c.latent.truncate(len * kv);
                    c.k_rope.truncate(len * rope);
                }
            }
        }
        self.len = len;
    }

    /// Bytes held by caches.
    pub fn cache_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Mla(c) => 4 * (c.latent.len() + c.k_rope.len()),
            })
            .sum()
    }
}
