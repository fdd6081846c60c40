//! One forward pass over the routed experts as a guard: [`ExpertPass::open`] starts it,
//! [`ExpertPass::finish`] ends it (the store's end-of-pass bookkeeping: the selections become
//! the previous pass's, the first layer's prefetch is planned, the route and heat records are
//! written). Dropped without `finish` — a `?` inside the layer loop, or a panic — the pass is
//! aborted: its selections, forecasts, pending prefetch and unwritten route record are dropped,
//! so nothing of a failed pass reaches the next one.
//!
//! A model in memory has no store; the guard is then inert, so one layer loop serves both.

use super::store::{ExpertStore, LayerExperts};
use crate::error::Result;

/// An open pass over a model's routed experts (see the module docs).
#[derive(Debug)]
#[must_use = "a pass that is not finished is aborted when dropped"]
pub struct ExpertPass<'a> {
    store: Option<&'a ExpertStore>,
}

impl<'a> ExpertPass<'a> {
    /// Open a pass over `store` (`None`: the experts are in memory; every call is a no-op).
    pub fn open(store: Option<&'a ExpertStore>) -> Self {
        ExpertPass { store }
    }

    /// Look-ahead hint with the residual stream `x` (`n` rows) right before layer `layer`'s
    /// FFN (see [`ExpertStore::hint_next`]).
    pub fn hint_next(&self, layer: usize, x: &[f32], n: usize) {
        if let Some(s) = self.store {
            s.hint_next(layer, x, n);
        }
    }

    /// Whether the pass runs over a store (the model is out of core).
    pub fn is_out_of_core(&self) -> bool {
        self.store.is_some()
    }

    /// Layer `layer`'s routed experts (`None` in memory: the MoE's own).
    pub fn layer(&self, layer: usize) -> Option<LayerExperts<'a>> {
        self.store.map(|s| s.layer(layer))
    }

    /// End the pass (the store's end-of-pass bookkeeping).
    pub fn finish(mut self) -> Result<()> {
        match self.store.take() {
            Some(s) => s.end_pass(),
            None => Ok(()),
        }
    }
}

impl Drop for ExpertPass<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.store.take() {
            s.abort_pass();
        }
    }
}
