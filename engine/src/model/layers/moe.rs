//! The routed mixture of experts: a sigmoid router with a selection-only correction bias and
//! group-limited top-k (DeepSeek-V3, Kimi, GLM-4.5) or a softmax router with plain top-k
//! (Qwen3-MoE), optional renormalisation and scaling, experts run over the union of a
//! batch's selections (each expert's weights read once for all rows that chose it), then the
//! shared experts.
//!
//! The weighted expert outputs are added per row, starting from zero, in the configured
//! [`Combine`] order: ascending expert id (HF `index_add_` over experts, DeepSeek-V3 and
//! Kimi-Linear) or router order (K3, `kimi-k3.md` §1.6). K3's *latent* MoE ([`Latent`]) runs
//! the experts at a smaller width: `r = W_down y`, experts on `r`, then
//! `W_up · RMSNorm(Σ w_i o_i)`; the shared experts always see the un-projected input.
//!
//! Routed experts come from an [`ExpertProvider`]: the MoE's own `experts` when they are in
//! memory, or an out-of-core cache that hands them out in whatever order (and on whichever
//! thread) they become available. Each expert's output is kept until all are done and then
//! combined in the configured order, so the result does not depend on that order.

use super::mlp::Mlp;
use super::ops::{Host, Ops, Routes};
use crate::backend::{WeightClass, matmul};
use crate::error::Result;
use crate::kernels::Matrix;
pub use crate::kernels::layer_spec::{RouterConfig, Scoring};
use crate::kernels::math::exp;
use crate::kernels::ops::sigmoid;

/// Serves a layer's routed experts to [`Moe::run`].
pub trait ExpertProvider {
    /// Call `run(id, expert)` exactly once for every id of `ids` (ascending, distinct), in any
    /// order and possibly on several threads at once (e.g. cached experts first, the others as
    /// their reads complete).
    fn for_each_expert(&self, ids: &[usize], run: &(dyn Fn(usize, &Mlp) + Sync)) -> Result<()>;
}

impl ExpertProvider for Vec<Mlp> {
    fn for_each_expert(&self, ids: &[usize], run: &(dyn Fn(usize, &Mlp) + Sync)) -> Result<()> {
        use rayon::prelude::*;
        ids.par_iter().for_each(|&id| run(id, &self[id]));
        Ok(())
    }
}

/// Order in which a row's weighted expert outputs are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Ascending expert id.
    Ascending,
    /// The router's order (descending selection score).
    RouteOrder,
}

/// K3's latent projection around the routed experts.
#[derive(Debug, Clone)]
pub struct Latent {
    /// `routed_expert_down_proj` `[latent, hidden]`.
    pub down: Matrix,
    /// `routed_expert_norm` on the expert sum (`latent_moe_use_norm`).
    pub norm: Option<Vec<f32>>,
    pub eps: f32,
    /// `routed_expert_up_proj` `[hidden, latent]`.
    pub up: Matrix,
}

/// A routed MoE block.
#[derive(Debug, Clone)]
pub struct Moe {
    /// `[E, H]` router weight (used in f32).
    pub gate: Matrix,
    /// `e_score_correction_bias` (selection only; empty when the router has none).
    pub bias: Vec<f32>,
    /// The router's own bias, added to the logits (gpt-oss `router.bias`; empty when none).
    pub logit_bias: Vec<f32>,
    pub router: RouterConfig,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
    /// A `[1, H]` gate on the shared expert's output: `σ(gate · x) · shared(x)` (Qwen3-Next,
    /// Qwen3.5 `shared_expert_gate`); `None`: the shared experts are added as they are.
    pub shared_gate: Option<Matrix>,
    pub latent: Option<Latent>,
    pub combine: Combine,
    /// Hash routing (DeepSeek-V4's first layers): the experts of a row are row `token` of this
    /// `[vocab, top_k]` table (`tid2eid`); the router still weights them.
    pub hash: Option<Vec<u32>>,
}

/// Pick `top_k` experts from `choice` scores, limited to the best `topk_group` of `n_group`
/// equal groups ranked by the sum of their two best scores. Ties go to the lower index.
/// Returns expert ids in descending score order.
pub fn select_experts(choice: &[f32], n_group: usize, topk_group: usize, top_k: usize) -> Vec<usize> {
    let e = choice.len();
    let mut allowed = vec![true; e];
    if n_group > 1 {
        let per = e / n_group;
        let group_score = |g: usize| {
            let mut best = [f32::NEG_INFINITY; 2];
            for &s in &choice[g * per..(g + 1) * per] {
                if s > best[0] {
                    best = [s, best[0]];
                } else if s > best[1] {
                    best[1] = s;
                }
            }
            best[0] + best[1]
        };
        let scores: Vec<f32> = (0..n_group).map(group_score).collect();
        let mut groups: Vec<usize> = (0..n_group).collect();
        groups.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        allowed.iter_mut().for_each(|a| *a = false);
        for &g in &groups[..topk_group] {
            allowed[g * per..(g + 1) * per].iter_mut().for_each(|a| *a = true);
        }
    }
    let mut ids: Vec<usize> = (0..e).filter(|&i| allowed[i]).collect();
    ids.sort_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    ids.truncate(top_k);
    ids
}

/// `exp(l - max) / Σ exp(l - max)` in f32, summed in index order (torch's float softmax).
fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| exp(l - max)).collect();
    let sum: f32 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

/// `sqrt(softplus(x))`, softplus as torch computes it (`β = 1`, threshold 20).
fn sqrt_softplus(x: f32) -> f32 {
    let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
    sp.sqrt()
}

/// The `top_k` largest logits (lower id first on ties) weighted by the softmax over just those
/// logits, summed in selection order (torch `topk` then `softmax(dim=1)`), times `scaling`.
fn top_k_softmax(logits: &[f32], top_k: usize, scaling: f32) -> Vec<(usize, f32)> {
    let ids = select_experts(logits, 1, 1, top_k);
    let picked: Vec<f32> = ids.iter().map(|&i| logits[i]).collect();
    ids.into_iter()
        .zip(softmax(&picked))
        .map(|(i, w)| (i, w * scaling))
        .collect()
}

impl Moe {
    /// Routing of one row from its router logits: `(expert, weight)` in router order
    /// (descending selection score, lower id first on ties).
    pub fn route(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        crate::kernels::math::fma_scope(|| self.route_row(logits))
    }

    #[inline(always)]
    fn route_row(&self, logits: &[f32]) -> Vec<(usize, f32)> {
        let r = &self.router;
        let scores: Vec<f32> = match r.scoring {
            Scoring::Sigmoid => logits.iter().map(|&l| sigmoid(l)).collect(),
            Scoring::Softmax => softmax(logits),
            Scoring::TopKSoftmax => return top_k_softmax(logits, r.top_k, r.scaling),
            Scoring::SqrtSoftplus => logits.iter().map(|&l| sqrt_softplus(l)).collect(),
        };
        let choice: Vec<f32> = match self.bias.is_empty() {
            true => scores.clone(),
            false => scores.iter().zip(&self.bias).map(|(s, b)| s + b).collect(),
        };
        let ids = select_experts(&choice, r.n_group, r.topk_group, r.top_k);
        let mut weights: Vec<f32> = ids.iter().map(|&i| scores[i]).collect();
        if r.norm_topk_prob {
            let denom = weights.iter().sum::<f32>() + 1e-20;
            weights.iter_mut().for_each(|w| *w /= denom);
        }
        ids.into_iter()
            .zip(weights)
            .map(|(i, w)| (i, w * r.scaling))
            .collect()
    }

    /// Routes of `n` rows of `x` whose tokens are `tokens`: a hash-routed layer's rows take their
    /// token's experts from the table, weighted as the router scores them (renormalised and
    /// scaled as configured); other layers route as [`Moe::routes`].
    pub fn routes_for(&self, x: &[f32], n: usize, tokens: &[u32]) -> Vec<Vec<(usize, f32)>> {
        match &self.hash {
            Some(table) => self.hashed(&self.logits(x, n), table, tokens),
            None => self.routes(x, n),
        }
    }

    /// Router logits of `n` rows of `x`.
    fn logits(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut logits = vec![0.0f32; n * self.gate.rows];
        matmul(&self.gate, x, n, &mut logits);
        logits
    }

    /// Hash routes: row `i` takes token `tokens[i]`'s experts from `table`, weighted by its
    /// logits.
    fn hashed(&self, logits: &[f32], table: &[u32], tokens: &[u32]) -> Routes {
        let k = self.router.top_k;
        logits
            .chunks(self.gate.rows)
            .zip(tokens)
            .map(|(l, &t)| {
                let ids = &table[t as usize * k..(t as usize + 1) * k];
                crate::kernels::math::fma_scope(|| self.weigh(l, ids))
            })
            .collect()
    }

    /// The routes of `n` rows from their router logits, in router order; a hash-routed layer
    /// needs the rows' `tokens` (a typed error without them).
    pub fn routes_of(&self, logits: Vec<f32>, n: usize, tokens: Option<&[u32]>) -> Result<Routes> {
        match (&self.hash, tokens) {
            (Some(table), Some(t)) if t.len() == n => Ok(self.hashed(&logits, table, t)),
            (Some(_), _) => Err(crate::error::Error::InvalidArgument {
                field: "tokens",
                reason: format!("a hash-routed MoE layer needs its {n} rows' token ids"),
            }),
            (None, _) => Ok(self.scored(logits)),
        }
    }

    /// `ids` weighted by their scores from `logits`, renormalised and scaled as configured.
    fn weigh(&self, logits: &[f32], ids: &[u32]) -> Vec<(usize, f32)> {
        let r = &self.router;
        let probs = matches!(r.scoring, Scoring::Softmax | Scoring::TopKSoftmax).then(|| softmax(logits));
        let score = |i: usize| match (&probs, r.scoring) {
            (Some(p), _) => p[i],
            (None, Scoring::SqrtSoftplus) => sqrt_softplus(logits[i]),
            (None, _) => sigmoid(logits[i]),
        };
        let mut weights: Vec<f32> = ids.iter().map(|&i| score(i as usize)).collect();
        if r.norm_topk_prob {
            let denom = weights.iter().sum::<f32>() + 1e-20;
            weights.iter_mut().for_each(|w| *w /= denom);
        }
        ids.iter()
            .zip(weights)
            .map(|(&i, w)| (i as usize, w * r.scaling))
            .collect()
    }

    /// Routes of `n` rows of `x` (already normalised): per row, `(expert, weight)` in router
    /// order. A hash-routed layer is routed by its scores here (a forecast: see
    /// [`Moe::routes_for`]).
    pub fn routes(&self, x: &[f32], n: usize) -> Vec<Vec<(usize, f32)>> {
        self.scored(self.logits(x, n))
    }

    /// Routes by the router's scores of `logits` (its logit bias added first).
    fn scored(&self, mut logits: Vec<f32>) -> Routes {
        let e = self.gate.rows;
        if !self.logit_bias.is_empty() {
            for row in logits.chunks_mut(e) {
                row.iter_mut().zip(&self.logit_bias).for_each(|(l, b)| *l += b);
            }
        }
        logits.chunks(e).map(|l| self.route(l)).collect()
    }

    /// The MoE over `n` normalised rows of `x` on `o`'s device (rows' `tokens` for hash
    /// routing; `experts`: out of core, else the MoE's own): route, sort each route into the
    /// combine order, project into the latent width (K3), the routed sum, the latent norm and
    /// up-projection, then the shared experts (optionally gated) added.
    pub fn run<O: Ops>(
        &self,
        o: &O,
        x: &O::Buf,
        n: usize,
        tokens: Option<&[u32]>,
        experts: Option<&dyn ExpertProvider>,
    ) -> Result<O::Buf> {
        let h = self.gate.cols;
        let logits = o.project(&self.gate, WeightClass::Spine, x, n)?;
        let mut routes = o.route(self, logits, n, tokens)?;
        if self.combine == Combine::Ascending {
            routes.iter_mut().for_each(|r| r.sort_by_key(|&(i, _)| i));
        }
        let latent_in = match &self.latent {
            Some(l) => Some(o.project(&l.down, WeightClass::Spine, x, n)?),
            None => None,
        };
        let width = self.latent.as_ref().map_or(h, |l| l.down.rows);
        let mut out = o.routed(self, experts, latent_in.as_ref().unwrap_or(x), width, &routes)?;
        if let Some(l) = &self.latent {
            if let Some(norm) = &l.norm {
                out = o.rms_norm(&out, &o.constant(norm)?, n, width, l.eps)?;
            }
            out = o.project(&l.up, WeightClass::Spine, &out, n)?;
        }
        if let Some(shared) = &self.shared {
            let mut s = shared.run(o, WeightClass::Spine, x, n)?;
            if let Some(gate) = &self.shared_gate {
                let logits = o.project(gate, WeightClass::Spine, x, n)?;
                s = o.gate_rows(s, &logits, n, h)?;
            }
            out = o.add(&out, &s, n * h)?;
        }
        Ok(out)
    }

    /// The CPU's dispatch of [`Ops::routed`]: every chosen expert once over its rows, in
    /// parallel as `provider` hands them out; each output kept until all are done, then
    /// combined in route order, so the result does not depend on the order they came in.
    pub(super) fn routed_host(
        &self,
        input: &[f32],
        width: usize,
        routes: &[Vec<(usize, f32)>],
        provider: &dyn ExpertProvider,
    ) -> Result<Vec<f32>> {
        let n = routes.len();
        // (row, slot in the row's route) per expert, in row order.
        let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.gate.rows];
        for (row, route) in routes.iter().enumerate() {
            for (slot, &(expert, _)) in route.iter().enumerate() {
                users[expert].push((row, slot));
            }
        }
        let mut offsets = Vec::with_capacity(n + 1);
        let mut total = 0;
        for route in routes {
            offsets.push(total);
            total += route.len();
        }
        let ids: Vec<usize> = (0..users.len()).filter(|&e| !users[e].is_empty()).collect();
        let outputs: Vec<std::sync::Mutex<Option<Vec<f32>>>> =
            (0..users.len()).map(|_| Default::default()).collect();
        provider.for_each_expert(&ids, &|expert, mlp| {
            let rows = &users[expert];
            let mut gathered = Vec::with_capacity(rows.len() * width);
            for &(row, _) in rows {
                gathered.extend_from_slice(&input[row * width..(row + 1) * width]);
            }
            let y = mlp
                .run(&Host, WeightClass::Expert, &gathered, rows.len())
                .expect("the CPU runs every MLP form");
            *outputs[expert].lock().unwrap() = Some(y);
        })?;
        let mut results = vec![0.0f32; total * width];
        for &expert in &ids {
            let y = outputs[expert]
                .lock()
                .unwrap()
                .take()
                .expect("the provider ran every selected expert");
            for (k, &(row, slot)) in users[expert].iter().enumerate() {
                let at = (offsets[row] + slot) * width;
                results[at..at + width].copy_from_slice(&y[k * width..(k + 1) * width]);
            }
        }
        offsets.push(total);
        let weights: Vec<f32> = routes.iter().flatten().map(|&(_, w)| w).collect();
        Ok(combine(&results, &weights, &offsets, width))
    }
}

/// The weighted sum of routed outputs: row `r` is `Σ v·w` over its slots
/// `offsets[r]..offsets[r + 1]` of `results` (`width` values each) and `weights`, in slot order,
/// from zero, a multiply then an add per element (`deltafin_combine` on the GPU).
pub fn combine(results: &[f32], weights: &[f32], offsets: &[usize], width: usize) -> Vec<f32> {
    let rows = offsets.len().saturating_sub(1);
    let mut out = vec![0.0f32; rows * width];
    for (row, o) in out.chunks_mut(width.max(1)).enumerate() {
        for slot in offsets[row]..offsets[row + 1] {
            let w = weights[slot];
            for (o, v) in o.iter_mut().zip(&results[slot * width..(slot + 1) * width]) {
                *o += v * w;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_routing_picks_the_largest_probabilities_and_renormalises() {
        let moe = Moe {
            gate: Matrix::new(
                crate::kernels::Format::F32,
                4,
                2,
                crate::weights::Blob::from_vec(vec![0; 32]),
                None,
            )
            .unwrap(),
            bias: Vec::new(),
            logit_bias: Vec::new(),
            router: RouterConfig {
                scoring: Scoring::Softmax,
                top_k: 2,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: true,
                scaling: 1.0,
            },
            experts: Vec::new(),
            shared: None,
            shared_gate: None,
            latent: None,
            combine: Combine::Ascending,
            hash: None,
        };
        let route = moe.route(&[0.0, 2.0, 1.0, -1.0]);
        assert_eq!(route.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
        let (a, b) = (2.0f32.exp(), 1.0f32.exp());
        assert!((route[0].1 - a / (a + b)).abs() < 1e-6 && (route[1].1 - b / (a + b)).abs() < 1e-6);
    }

    #[test]
    fn plain_top_k_takes_best_scores_lowest_index_on_ties() {
        assert_eq!(select_experts(&[0.1, 0.9, 0.5, 0.9], 1, 1, 2), vec![1, 3]);
    }

    #[test]
    fn group_limit_changes_the_selection() {
        // Groups of 2: [0.9, 0.0] sum 0.9, [0.5, 0.5] sum 1.0, [0.45, 0.45] 0.9, [0.0, 0.1] 0.1.
        let choice = [0.9, 0.0, 0.5, 0.5, 0.45, 0.45, 0.0, 0.1];
        assert_eq!(select_experts(&choice, 1, 1, 2), vec![0, 2]);
        // Best two groups: group 1 (1.0) then group 0 (0.9, lower index than group 2).
        assert_eq!(select_experts(&choice, 4, 2, 2), vec![0, 2]);
        assert_eq!(select_experts(&choice, 4, 1, 2), vec![2, 3]);
    }

    /// DeepSeek-V4's routing: `sqrt(softplus(logit))` scores (the logit itself above 20), and
    /// a hash-routed layer takes its token's experts from the table, weighted by those scores.
    #[test]
    fn sqrt_softplus_scores_and_hash_routes() {
        assert_eq!(sqrt_softplus(25.0), 5.0);
        assert!((sqrt_softplus(0.0) - 2f32.ln().sqrt()).abs() < 1e-7);
        let bytes = [1.0f32, -1.0, 3.0, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let gate = Matrix::new(
            crate::kernels::Format::F32,
            4,
            1,
            crate::weights::Blob::from_vec(bytes),
            None,
        )
        .unwrap();
        let mut moe = Moe {
            gate,
            bias: vec![0.0, 0.0, -10.0, 0.0],
            logit_bias: Vec::new(),
            router: RouterConfig {
                scoring: Scoring::SqrtSoftplus,
                top_k: 2,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: true,
                scaling: 1.5,
            },
            experts: Vec::new(),
            shared: None,
            shared_gate: None,
            latent: None,
            combine: Combine::Ascending,
            hash: None,
        };
        // Selection on score + bias: expert 2 is biased out.
        let ids: Vec<usize> = moe.routes(&[1.0], 1)[0].iter().map(|r| r.0).collect();
        assert_eq!(ids, vec![0, 3]);
        // Token 1's row of the table picks experts 2 and 1 whatever their scores.
        moe.hash = Some(vec![0, 3, 2, 1]);
        let r = &moe.routes_for(&[1.0], 1, &[1])[0];
        let (s2, s1) = (sqrt_softplus(3.0), sqrt_softplus(-1.0));
        assert_eq!(r.iter().map(|r| r.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((r[0].1 - 1.5 * s2 / (s2 + s1)).abs() < 1e-6);
        assert!(
            moe.run(&Host, &vec![1.0], 1, None, None).is_err(),
            "hash routing needs tokens"
        );
    }
}
