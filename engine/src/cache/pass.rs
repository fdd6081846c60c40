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
    /// The rows' tokens, when known: a hash-routed layer's forecast is then its routes.
    tokens: &'a [u32],
}

impl<'a> ExpertPass<'a> {
    /// Open a pass over `store` (`None`: the experts are in memory; every call is a no-op).
    pub fn open(store: Option<&'a ExpertStore>) -> Self {
        ExpertPass { store, tokens: &[] }
    }

    /// The same pass told the rows' tokens (hash-routed layers are forecast exactly).
    pub fn with_tokens(mut self, tokens: &'a [u32]) -> Self {
        self.tokens = tokens;
        self
    }

    /// Look-ahead hint with the residual stream `x` (`n` rows) right before layer `layer`'s
    /// FFN (see [`ExpertStore::hint_next`]).
    pub fn hint_next(&self, layer: usize, x: &[f32], n: usize) {
        if let Some(s) = self.store {
            s.hint_next(layer, x, n, self.tokens);
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

#[cfg(test)]
mod tests {
    // A failed out-of-core pass leaves nothing to the next one: the layer loops open their pass
    // through `cache::ExpertPass`, so an error inside the loop aborts it (selections, forecasts,
    // pending prefetch and the route record are dropped) and the retried pass is exactly a fresh
    // model's, down to its route-trace line.

    use std::path::Path;

    use crate::arch::{LogitRows, Model, SeqInput};
    use crate::cache::{OocOptions, OocRuntime};
    use crate::synth::{DeepseekSynth, ExpertFormat, KimiSynth};

    fn load(dir: &Path, routes: &Path) -> (Box<dyn Model>, OocRuntime) {
        let mut o = OocOptions::with_budget(u64::MAX / 4);
        o.prefetch = true;
        o.reserve_bytes = 0;
        o.route_trace = Some(routes.to_path_buf());
        crate::arch::load_budgeted(dir, &o).unwrap()
    }

    fn pass(
        model: &dyn Model,
        state: &mut crate::state::SeqState,
        tokens: &[u32],
    ) -> crate::Result<Vec<f32>> {
        let mut batch = [SeqInput {
            state,
            tokens,
            logits: LogitRows::All,
        }];
        model.forward(&mut batch, None)
    }

    fn check(write: impl Fn(&Path)) {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path());
        let tokens = [3u32, 7, 11, 2, 5];
        let (fresh, _rt) = load(dir.path(), &dir.path().join("fresh.jsonl"));
        let want = pass(fresh.as_ref(), &mut fresh.new_state(), &tokens).unwrap();

        let (model, rt) = load(dir.path(), &dir.path().join("failed.jsonl"));
        rt.reader.inject_eio(0, 0..u64::MAX);
        let mut state = model.new_state();
        let err = pass(model.as_ref(), &mut state, &tokens).unwrap_err();
        assert_eq!(err.kind(), "weights_unavailable", "{err}");
        assert!(
            rt.experts.between_passes(),
            "the failed pass left its selections behind"
        );
        assert_eq!(state.len(), 0, "the failed pass was rolled back");
        rt.reader.clear_injected();
        rt.reader.health().unwrap();
        let got = pass(model.as_ref(), &mut state, &tokens).unwrap();
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(read("failed.jsonl"), read("fresh.jsonl"), "route lines differ");
        assert_eq!(read("fresh.jsonl").lines().count(), 1);
    }

    #[test]
    fn a_failed_pass_leaks_nothing_into_the_next_deepseek() {
        check(|d| DeepseekSynth::tiny(ExpertFormat::Bf16).write(d).unwrap());
    }

    /// GLM-5's sparse attention (5 tokens against a top-3 indexer, the second layer sharing the
    /// first's choice): the failed pass's indexer keys are rolled back with the latents.
    #[test]
    fn a_failed_pass_leaks_nothing_into_the_next_glm5() {
        let dsa = crate::synth::DsaShape {
            heads: 2,
            head_dim: 16,
            topk: 3,
            freq: 2,
        };
        check(|d| {
            DeepseekSynth {
                dsa: Some(dsa),
                ..DeepseekSynth::tiny(ExpertFormat::Bf16)
            }
            .write(d)
            .unwrap()
        });
    }

    #[test]
    fn a_failed_pass_leaks_nothing_into_the_next_kimi_linear() {
        check(|d| KimiSynth::linear_tiny().write(d).unwrap());
    }

    #[test]
    fn a_failed_pass_leaks_nothing_into_the_next_k3() {
        check(|d| KimiSynth::k3_tiny().write(d).unwrap());
    }
}
