//! What a box will do: decode and prefill tokens per second predicted from a residency plan,
//! the model's routing shape, the disk's bandwidth and the kernels' measured per-byte cost.
//! Pure arithmetic, tested without I/O; `deltafin plan` measures the inputs here and prints
//! the formula beside the figures.
//!
//! One batched step of `s` rows (decode: one token of each of `s` streams; prefill: `s` prompt
//! tokens) reads from disk the streamed spine and the routed experts its rows select that the
//! cache does not hold, and computes over every weight byte it touches:
//!
//! - `union(s) = E · (1 − (1 − k/E)^s)`: distinct experts per MoE layer when `s` rows each pick
//!   `k` of `E` independently and uniformly (the worst case; routing locality only lowers it);
//! - `disk(s) = streamed + L · union(s) · (1 − h) · slot`, with `h` the share of experts the
//!   plan's cache holds (hits under uniform routing); or, from a measured routing
//!   ([`Hits::Measured`]), `Σ_e (1 − (1 − p_e)^s) · (1 − held_e) · slot` and
//!   `union(s) = Σ_e (1 − (1 − p_e)^s) / L`, with `held_e` what the policy keeps
//!   (`cache::popularity`);
//! - `compute(s) = spine · c(s) + L · union(s) · slot · c(s·k / union(s))`, with `c(r)` the
//!   kernels' measured seconds per weight byte at `r` rows, scaled by the cores: the spine
//!   runs every row, an expert only the rows routed to it;
//! - `step(s) = disk(s) / bandwidth + compute(s)`: a layer computes once its experts have
//!   arrived, so reads and compute add up; the look-ahead prefetch overlaps part of them, which
//!   the prediction leaves out (decode measured 0.74-1.24 of it on the `bench serve` model at
//!   three limits, 0.92-0.99 on dsv3-bench under 4 GiB: `docs/performance.md`);
//! - tokens per second `= s / step(s)`.

use serde::Serialize;

use super::plan::ResidencyPlan;
use super::popularity::Popularity;

/// Seconds of kernel time per weight byte at a number of rows, measured on some cores.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelCost {
    /// `(rows, seconds per weight byte)`, rows ascending.
    pub points: Vec<(usize, f64)>,
    /// Cores the points were measured with.
    pub cores: usize,
}

impl KernelCost {
    /// Seconds per weight byte at `rows` rows (a mean, so fractional) on `cores` cores: linear
    /// between the measured row counts, proportional to rows past the last one, and inversely
    /// proportional to the cores (the kernels split a product's rows over the cores).
    pub fn at(&self, rows: f64, cores: usize) -> f64 {
        let p = &self.points;
        let Some(&(last_rows, last)) = p.last() else {
            return 0.0;
        };
        let here = if rows <= p[0].0 as f64 {
            p[0].1
        } else if rows >= last_rows as f64 {
            last * rows / last_rows as f64
        } else {
            let i = p.partition_point(|&(r, _)| r as f64 <= rows);
            let ((r0, c0), (r1, c1)) = (p[i - 1], p[i]);
            c0 + (c1 - c0) * (rows - r0 as f64) / (r1 - r0) as f64
        };
        here * self.cores as f64 / cores.max(1) as f64
    }
}

/// The box a prediction is for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Machine {
    pub disk_bytes_per_second: f64,
    pub cores: usize,
    pub kernel: KernelCost,
}

/// The routed-expert shape of the model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Routing {
    pub moe_layers: usize,
    pub experts_per_layer: usize,
    pub top_k: usize,
}

impl Routing {
    /// Distinct experts per MoE layer selected by `rows` independent uniform rows.
    pub fn union(&self, rows: usize) -> f64 {
        let e = self.experts_per_layer as f64;
        if e == 0.0 {
            return 0.0;
        }
        let miss = 1.0 - (self.top_k as f64 / e).min(1.0);
        e * (1.0 - miss.powi(rows.min(i32::MAX as usize) as i32))
    }
}

/// One predicted step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPrediction {
    pub rows: usize,
    pub union_experts_per_layer: f64,
    pub disk_bytes: f64,
    pub disk_seconds: f64,
    pub compute_bytes: f64,
    pub compute_seconds: f64,
    /// `"disk"` or `"compute"`: which one takes longer.
    pub bound: &'static str,
    pub tokens_per_second: f64,
}

/// Which experts a step finds in the cache.
#[derive(Debug, Clone, Copy)]
pub enum Hits<'a> {
    /// Uniform routing: the plan's cache fraction of every selection hits (what any policy
    /// gets when every expert is equally likely).
    Share,
    /// Measured routing: each expert's chance of selection, and of being held by the cache
    /// under the engine's policy ([`Popularity::held`]).
    Measured(&'a Popularity, &'a [Vec<f64>]),
}

/// Predict one step of `rows` rows under `plan`.
pub fn step(
    plan: &ResidencyPlan,
    routing: &Routing,
    machine: &Machine,
    rows: usize,
    hits: Hits<'_>,
) -> StepPrediction {
    let rows = rows.max(1);
    let layers = routing.moe_layers as f64;
    // Distinct experts over all MoE layers, and those not held.
    let (selected, missed) = match hits {
        Hits::Share => {
            let all = layers * routing.union(rows);
            (all, all * (1.0 - plan.cache_fraction.clamp(0.0, 1.0)))
        }
        Hits::Measured(pop, held) => pop.step(held, rows),
    };
    let union = if layers > 0.0 { selected / layers } else { 0.0 };
    let slot = plan.slot_bytes as f64;
    let disk_bytes = plan.streamed_bytes_per_pass as f64 + missed * slot;
    let spine = plan.layer_bytes.iter().sum::<u64>() as f64;
    let compute_bytes = spine + layers * union * slot;
    let expert_rows = if union > 0.0 {
        (rows * routing.top_k) as f64 / union
    } else {
        0.0
    };
    let disk_seconds = if disk_bytes > 0.0 {
        disk_bytes / machine.disk_bytes_per_second.max(1.0)
    } else {
        0.0
    };
    let cost = |r: f64| machine.kernel.at(r, machine.cores);
    let compute_seconds = spine * cost(rows as f64) + layers * union * slot * cost(expert_rows);
    let seconds = disk_seconds + compute_seconds;
    StepPrediction {
        rows,
        union_experts_per_layer: union,
        disk_bytes,
        disk_seconds,
        compute_bytes,
        compute_seconds,
        bound: if disk_seconds >= compute_seconds {
            "disk"
        } else {
            "compute"
        },
        tokens_per_second: if seconds > 0.0 { rows as f64 / seconds } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::plan::{PlanInput, plan};

    fn plan_with(budget: u64) -> ResidencyPlan {
        plan(&PlanInput {
            budget,
            fixed_bytes: 1 << 20,
            reserve_bytes: 1 << 20,
            context_bytes: 0,
            layer_bytes: vec![4 << 20; 4],
            slot_bytes: 1 << 20,
            experts: 4 * 64,
            min_expert_slots: 8,
        })
        .unwrap()
    }

    fn machine(disk: f64) -> Machine {
        Machine {
            disk_bytes_per_second: disk,
            cores: 2,
            kernel: KernelCost {
                points: vec![(1, 1e-10), (8, 2e-10), (64, 8e-10)],
                cores: 2,
            },
        }
    }

    const ROUTING: Routing = Routing {
        moe_layers: 4,
        experts_per_layer: 64,
        top_k: 6,
    };

    #[test]
    fn the_union_of_uniform_rows_grows_from_top_k_towards_every_expert() {
        assert_eq!(ROUTING.union(1), 6.0);
        let u8 = ROUTING.union(8);
        assert!((u8 - 64.0 * (1.0 - (58.0f64 / 64.0).powi(8))).abs() < 1e-9);
        assert!(u8 > 30.0 && u8 < 48.0, "{u8}");
        assert!(ROUTING.union(10_000) > 63.99);
    }

    #[test]
    fn kernel_cost_interpolates_between_rows_and_scales_with_cores() {
        let k = machine(1.0).kernel;
        assert_eq!(k.at(1.0, 2), 1e-10);
        assert!((k.at(4.0, 2) - (1e-10 + 1e-10 * 3.0 / 7.0)).abs() < 1e-20);
        assert!((k.at(128.0, 2) - 16e-10).abs() < 1e-20);
        assert!((k.at(1.0, 4) - 0.5e-10).abs() < 1e-20);
    }

    #[test]
    fn a_slow_disk_bounds_decode_and_more_memory_lowers_the_bytes_read() {
        let m = machine(1e9);
        let small = step(&plan_with(40 << 20), &ROUTING, &m, 1, Hits::Share);
        let large = step(&plan_with(200 << 20), &ROUTING, &m, 1, Hits::Share);
        assert_eq!(small.bound, "disk");
        assert!(small.disk_bytes > large.disk_bytes);
        assert!(large.tokens_per_second > small.tokens_per_second);
        // Eight streams share experts: fewer disk bytes per token than one.
        let eight = step(&plan_with(40 << 20), &ROUTING, &m, 8, Hits::Share);
        assert!(eight.disk_bytes / 8.0 < small.disk_bytes);
        assert!(eight.tokens_per_second > small.tokens_per_second);
    }

    #[test]
    fn a_prompt_runs_every_row_through_the_spine_and_its_routed_rows_through_each_expert() {
        let p = plan_with(1 << 30);
        let s = step(&p, &ROUTING, &machine(1e9), 512, Hits::Share);
        // 512 rows x top-6 over 64 experts: 48 rows per expert, where the spine takes 512.
        let k = machine(1e9).kernel;
        let want = (16 << 20) as f64 * k.at(512.0, 2) + 4.0 * 64.0 * (1 << 20) as f64 * k.at(48.0, 2);
        assert!(
            (s.compute_seconds - want).abs() < 1e-9 * want,
            "{} {want}",
            s.compute_seconds
        );
    }

    /// A measured routing that is uniform predicts what the share model does (LFU's hottest
    /// set is then any set of the cache's size); a skewed one under LFU reads less.
    #[test]
    fn a_measured_uniform_routing_predicts_the_share_and_skew_reads_less() {
        use crate::cache::policy::PolicyKind;
        let p = plan_with(40 << 20);
        let slots = p.expert_slots as usize;
        let m = machine(1e9);
        let uniform = Popularity::uniform(4, 64, 6);
        let held = uniform.held(slots, PolicyKind::Lfu);
        for rows in [1, 8] {
            let share = step(&p, &ROUTING, &m, rows, Hits::Share);
            let measured = step(&p, &ROUTING, &m, rows, Hits::Measured(&uniform, &held));
            assert!((share.disk_bytes - measured.disk_bytes).abs() < 1e-6 * share.disk_bytes);
            assert!((share.union_experts_per_layer - measured.union_experts_per_layer).abs() < 1e-9);
        }
        let mut skewed = uniform.clone();
        for layer in &mut skewed.layers {
            layer[..6].iter_mut().for_each(|q| *q = 0.5);
            let rest = 3.0 / 58.0;
            layer[6..].iter_mut().for_each(|q| *q = rest);
        }
        let held = skewed.held(slots, PolicyKind::Lfu);
        let s = step(&p, &ROUTING, &m, 1, Hits::Measured(&skewed, &held));
        assert!(s.disk_bytes < step(&p, &ROUTING, &m, 1, Hits::Share).disk_bytes);
    }

    #[test]
    fn everything_in_memory_is_compute_bound() {
        let p = plan_with(1 << 30);
        assert_eq!(p.cache_fraction, 1.0);
        let s = step(&p, &ROUTING, &machine(1e9), 1, Hits::Share);
        assert_eq!(s.disk_bytes, 0.0);
        assert_eq!(s.bound, "compute");
        let want = 1.0 / ((16 << 20) as f64 + 4.0 * 6.0 * (1 << 20) as f64) / 1e-10;
        assert!((s.tokens_per_second - want).abs() < 1e-9 * want);
    }
}
