//! The residency plan: from a memory budget, decide what stays resident, which spine layers
//! stream every pass, and how many expert-cache slots remain. Pure arithmetic (tested without
//! I/O), plus the probe of the default budget (cgroup limit or available memory, minus
//! headroom).
//!
//! Order of residency (hottest bytes first): fixed tensors (embeddings, head, final norm,
//! routers and the norms the prefetcher needs) and a reserve for state and scratch; then the
//! spine of layers 0, 1, 2, … as an ordered prefix (every spine byte is used by every pass,
//! while an expert byte is used by a fraction of them); then the expert cache, at least
//! `min_expert_slots` slots. Layers after the prefix stream through two arena buffers of the
//! largest streamed layer (the next layer's read overlaps this layer's compute).

use serde::Serialize;

use crate::error::{Error, Result};

/// What the plan needs to know.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// Bytes the engine may use for weights, caches and state.
    pub budget: u64,
    /// Always-resident tensor bytes.
    pub fixed_bytes: u64,
    /// Reserved for activations and scratch.
    pub reserve_bytes: u64,
    /// The context memory: every sequence's attention caches, recurrent states, checkpoints
    /// and the reuse cache (the scheduler keeps them inside it).
    pub context_bytes: u64,
    /// Spine bytes of each layer, in layer order.
    pub layer_bytes: Vec<u64>,
    /// Bytes of one expert slot.
    pub slot_bytes: u64,
    /// Routed experts in the model (an upper bound on useful slots).
    pub experts: u64,
    /// Fewest slots the cache may have.
    pub min_expert_slots: u64,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResidencyPlan {
    pub budget: u64,
    pub fixed_bytes: u64,
    pub reserve_bytes: u64,
    /// Sequence state (see [`PlanInput::context_bytes`]).
    pub context_bytes: u64,
    /// Layers `0..resident_layers` keep their spine in memory.
    pub resident_layers: usize,
    /// Layers whose spine is read every pass.
    pub streamed_layers: Vec<usize>,
    pub resident_spine_bytes: u64,
    /// Two buffers of the largest streamed layer (0 when nothing streams).
    pub arena_bytes: u64,
    pub streamed_bytes_per_pass: u64,
    /// Spine bytes of each layer (as read, aligned).
    pub layer_bytes: Vec<u64>,
    pub expert_slots: u64,
    pub slot_bytes: u64,
    pub expert_cache_bytes: u64,
    /// Routed experts in the model.
    pub experts: u64,
    /// Share of all experts the cache can hold.
    pub cache_fraction: f64,
    /// Checkpoint tensors the model never reads (a vision tower, MTP layers).
    pub unread: Unread,
}

/// The checkpoint tensors no layout reads, grouped by name prefix.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Unread {
    pub tensors: usize,
    pub bytes: u64,
    /// Each group's first two name components (`model.visual`, `mtp.layers`) with its count.
    pub groups: Vec<(String, usize)>,
}

impl Unread {
    /// The tensors of `all` (`(name, shard, offset, len)`) whose bytes no range of `read`
    /// (`(shard, start, end)`) touches.
    pub fn of(all: &[(&str, usize, u64, u64)], read: &[(usize, u64, u64)]) -> Unread {
        let mut sorted = read.to_vec();
        sorted.sort_unstable();
        // Disjoint, sorted unions: the only range that can touch `start..end` is the last one
        // starting before `end`.
        let mut merged: Vec<(usize, u64, u64)> = Vec::with_capacity(sorted.len());
        for (shard, start, end) in sorted {
            match merged.last_mut() {
                Some(m) if m.0 == shard && start <= m.2 => m.2 = m.2.max(end),
                _ => merged.push((shard, start, end)),
            }
        }
        let touched = |shard: usize, start: u64, end: u64| {
            let i = merged.partition_point(|r| (r.0, r.1) < (shard, end));
            i > 0 && merged[i - 1].0 == shard && merged[i - 1].2 > start
        };
        let mut out = Unread::default();
        let mut groups = std::collections::BTreeMap::<String, usize>::new();
        for &(name, shard, offset, len) in all {
            if len == 0 || touched(shard, offset, offset + len) {
                continue;
            }
            out.tensors += 1;
            out.bytes += len;
            let group: Vec<&str> = name.splitn(3, '.').take(2).collect();
            *groups.entry(group.join(".")).or_default() += 1;
        }
        out.groups = groups.into_iter().collect();
        out
    }
}

impl ResidencyPlan {
    /// Everything the plan allocates.
    pub fn total_bytes(&self) -> u64 {
        self.fixed_bytes
            + self.reserve_bytes
            + self.context_bytes
            + self.resident_spine_bytes
            + self.arena_bytes
            + self.expert_cache_bytes
    }
}

/// Make the plan, or explain why the budget cannot work.
pub fn plan(input: &PlanInput) -> Result<ResidencyPlan> {
    let layers = input.layer_bytes.len();
    let base = input.fixed_bytes + input.reserve_bytes + input.context_bytes;
    let min_slots = input.min_expert_slots.max(1).min(input.experts.max(1));
    let min_cache = min_slots * input.slot_bytes;
    let spine_cost = |k: usize| -> u64 {
        let resident: u64 = input.layer_bytes[..k].iter().sum();
        let arena = 2 * input.layer_bytes[k..].iter().copied().max().unwrap_or(0);
        resident + arena
    };
    let Some(k) = (0..=layers)
        .rev()
        .find(|&k| base + spine_cost(k) + min_cache <= input.budget)
    else {
        let need = base + spine_cost(0) + min_cache;
        return Err(Error::Budget(format!(
            "{} is too small: fixed tensors {} + reserve {} + context memory {} + two streamed-layer buffers {} + {min_slots} expert slot(s) {} need {}",
            human(input.budget),
            human(input.fixed_bytes),
            human(input.reserve_bytes),
            human(input.context_bytes),
            human(spine_cost(0)),
            human(min_cache),
            human(need)
        )));
    };
    let resident_spine: u64 = input.layer_bytes[..k].iter().sum();
    let arena = spine_cost(k) - resident_spine;
    let left = input.budget - base - spine_cost(k);
    let slots = (left / input.slot_bytes.max(1)).min(input.experts).max(min_slots);
    Ok(ResidencyPlan {
        budget: input.budget,
        fixed_bytes: input.fixed_bytes,
        reserve_bytes: input.reserve_bytes,
        context_bytes: input.context_bytes,
        resident_layers: k,
        streamed_layers: (k..layers).collect(),
        resident_spine_bytes: resident_spine,
        arena_bytes: arena,
        streamed_bytes_per_pass: input.layer_bytes[k..].iter().sum(),
        layer_bytes: input.layer_bytes.clone(),
        expert_slots: slots,
        slot_bytes: input.slot_bytes,
        expert_cache_bytes: slots * input.slot_bytes,
        experts: input.experts,
        cache_fraction: if input.experts == 0 {
            1.0
        } else {
            slots as f64 / input.experts as f64
        },
        unread: Unread::default(),
    })
}

/// `n` bytes in binary units for messages.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A size on the command line that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SizeError {
    #[error("`{0}` is not a size (e.g. 4G, 512M)")]
    NotANumber(String),
    #[error("unknown size unit `{unit}` in `{input}` (B, K, M, G, T, optionally with B or iB)")]
    Unit { unit: String, input: String },
    #[error("`{0}` is negative")]
    Negative(String),
}

/// Parse a size such as `4G`, `512MiB`, `1.5g`, `123456` (bytes).
pub fn parse_size(s: &str) -> std::result::Result<u64, SizeError> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| SizeError::NotANumber(s.to_string()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(SizeError::Unit {
                unit: other.to_string(),
                input: s.to_string(),
            });
        }
    };
    if value.is_nan() || value < 0.0 {
        return Err(SizeError::Negative(s.to_string()));
    }
    Ok((value * mult as f64) as u64)
}

/// The memory limit of a cgroup (v1 `memory.limit_in_bytes` or v2 `memory.max` contents), if
/// it limits anything.
pub fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let v: u64 = t.parse().ok()?;
    // v1 reports "unlimited" as a huge page-rounded value.
    (v < (1u64 << 60)).then_some(v)
}

/// `MemAvailable` from `/proc/meminfo` contents, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// Headroom kept out of the budget for the process itself and a little page cache.
pub fn headroom(limit: u64) -> u64 {
    (64 << 20) + limit / 32
}

/// The default budget: the tightest of the process's cgroup limit (minus what the group
/// already uses) and available memory, minus [`headroom`].
pub fn default_budget(cgroup_limit: Option<u64>, cgroup_usage: u64, mem_available: u64) -> u64 {
    let from_cgroup = cgroup_limit
        .map(|l| l.saturating_sub(cgroup_usage))
        .unwrap_or(u64::MAX);
    let base = from_cgroup.min(mem_available);
    base.saturating_sub(headroom(base))
}

/// Probe this machine: the memory cgroup of this process (v1 or v2) and `/proc/meminfo`.
/// Returns `(limit, usage, available)`; missing files give `None` / 0 / `u64::MAX`.
pub fn probe_memory() -> (Option<u64>, u64, u64) {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let available = read("/proc/meminfo")
        .and_then(|m| parse_mem_available(&m))
        .unwrap_or(u64::MAX);
    let cgroups = read("/proc/self/cgroup").unwrap_or_default();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let dir = if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}")
        } else if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}")
        } else {
            continue;
        };
        let limit =
            read(&format!("{dir}/memory.limit_in_bytes")).or_else(|| read(&format!("{dir}/memory.max")));
        if let Some(limit) = limit.as_deref().and_then(parse_cgroup_limit) {
            let usage = read(&format!("{dir}/memory.usage_in_bytes"))
                .or_else(|| read(&format!("{dir}/memory.current")))
                .and_then(|u| u.trim().parse().ok())
                .unwrap_or(0);
            return (Some(limit), usage, available);
        }
    }
    (None, 0, available)
}

#[cfg(test)]
mod tests {
    #[test]
    fn unread_tensors_are_those_no_read_range_touches() {
        let all = [
            ("model.layers.0.mlp.gate.weight", 0, 0, 100),
            ("model.visual.blocks.0.attn.qkv.weight", 0, 100, 50),
            ("model.visual.merger.mlp.0.weight", 1, 0, 10),
            ("mtp.layers.0.mlp.experts.gate_up_proj", 1, 10, 90),
            ("model.layers.0.mlp.experts.gate_up_proj", 1, 100, 400),
        ];
        // Layer 0's gate, and one expert's slice of the stacked experts.
        let read = [(0, 0, 100), (1, 200, 300)];
        let u = Unread::of(&all, &read);
        assert_eq!((u.tensors, u.bytes), (3, 150));
        assert_eq!(
            u.groups,
            vec![("model.visual".to_string(), 2), ("mtp.layers".to_string(), 1)]
        );
        assert_eq!(Unread::of(&all, &[(0, 0, 1000), (1, 0, 1000)]).tensors, 0);
    }

    use super::*;

    fn input(budget: u64) -> PlanInput {
        PlanInput {
            budget,
            fixed_bytes: 100,
            reserve_bytes: 20,
            context_bytes: 30,
            layer_bytes: vec![40, 60, 60, 60],
            slot_bytes: 30,
            experts: 100,
            min_expert_slots: 2,
        }
    }

    #[test]
    fn everything_resident_when_it_fits() {
        let p = plan(&input(150 + 220 + 30 * 100 + 7)).unwrap();
        assert_eq!(p.resident_layers, 4);
        assert!(p.streamed_layers.is_empty());
        assert_eq!(p.arena_bytes, 0);
        assert_eq!(p.expert_slots, 100, "never more slots than experts");
        assert!(p.total_bytes() <= p.budget);
    }

    #[test]
    fn the_spine_prefix_comes_before_expert_slots() {
        // 150 fixed + 220 spine + 2 slots = 430: all layers resident, the rest to experts.
        let p = plan(&input(500)).unwrap();
        assert_eq!(p.resident_layers, 4);
        assert_eq!(p.expert_slots, 4);
        assert!(p.total_bytes() <= 500);
    }

    #[test]
    fn tight_budgets_stream_the_tail_layers() {
        // k=2: 150 + 100 resident + 2*60 arena + 60 (2 slots) = 430 > 400; k=1: 150+40+120+60 = 370.
        let p = plan(&input(400)).unwrap();
        assert_eq!(p.resident_layers, 1);
        assert_eq!(p.streamed_layers, vec![1, 2, 3]);
        assert_eq!(p.arena_bytes, 120);
        assert_eq!(p.streamed_bytes_per_pass, 180);
        assert_eq!(p.expert_slots, 3);
        assert!(p.total_bytes() <= 400);
    }

    #[test]
    fn too_small_a_budget_is_a_typed_error() {
        let e = plan(&input(300)).unwrap_err();
        assert_eq!(e.kind(), "budget");
        assert!(e.to_string().contains("too small"), "{e}");
        assert!(e.to_string().contains("context memory 30 B"), "{e}");
    }

    #[test]
    fn the_context_memory_is_inside_the_budget() {
        let mut i = input(500);
        let base = plan(&i).unwrap();
        i.context_bytes += 60;
        let p = plan(&i).unwrap();
        assert_eq!(p.context_bytes, 90);
        assert_eq!(
            p.expert_slots,
            base.expert_slots - 2,
            "its bytes come out of the expert cache"
        );
        assert!(p.total_bytes() <= 500);
    }

    #[test]
    fn sizes_cgroups_and_meminfo_parse() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(matches!(parse_size("4X"), Err(SizeError::Unit { .. })));
        assert_eq!(parse_size("-1G"), Err(SizeError::Negative("-1G".into())));
        assert_eq!(parse_size("lots"), Err(SizeError::NotANumber("lots".into())));
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None);
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("2147483648\n"), Some(2 << 30));
        assert_eq!(
            parse_mem_available("MemTotal: 10 kB\nMemAvailable:    2048 kB\n"),
            Some(2 << 20)
        );
        let b = default_budget(Some(4 << 30), 1 << 30, 20 << 30);
        assert_eq!(b, (3u64 << 30) - headroom(3 << 30));
        assert_eq!(human(3 << 29), "1.50 GiB");
    }
}
