//! `deltafin warm`: fetch ahead of use the routed experts that a recorded route trace used most,
//! so the first requests after a stream install do not wait for the network.
//!
//! Planning is pure ([`plan_warm`], [`coalesce`]): the top `N` experts by pass count (ties by
//! layer, expert), their catalog ranges minus what is already local, sorted by file and offset,
//! and touching ranges merged into runs of at most `max_run` bytes (one HTTP request each, as
//! setup does). Fetching goes through [`StreamStore::ensure_range`], so it is crash-safe and a
//! shard whose last range arrives is SHA-256 verified and published like any other.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::manifest::Mode;
use crate::safetensors::{ExpertKey, ExpertRange};
use crate::stream::{ExpertSource, StreamStore};

/// What to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPlan {
    /// The experts chosen (at most `N`), hottest first.
    pub selected: Vec<ExpertKey>,
    /// Of those, how many were entirely local already.
    pub already_local: usize,
    /// Ranges to fetch, `(file, range)`, coalesced.
    pub runs: Vec<(String, Range<u64>)>,
}

/// What a warm run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WarmReport {
    /// Distinct experts in the trace, and the passes it holds.
    pub experts_in_trace: usize,
    pub passes: u64,
    /// A torn last trace line (a recorder killed mid-write) was skipped.
    pub torn_tail: bool,
    /// Experts chosen (`--top`, or fewer when the trace has fewer).
    pub selected: usize,
    pub already_local: usize,
    /// Experts made local by this run.
    pub fetched: usize,
    /// Range requests (after coalescing) and bytes received.
    pub requests: usize,
    pub bytes: u64,
    /// Shards that completed, verified and were published during this run.
    pub files_published: u64,
    pub seconds: f64,
}

/// Merge touching ranges of the same file (sorted by file, offset) into runs of at most `max_run`
/// bytes (a single range longer than that stays whole).
pub fn coalesce(mut ranges: Vec<(String, Range<u64>)>, max_run: u64) -> Vec<(String, Range<u64>)> {
    ranges.sort_by(|a, b| (&a.0, a.1.start, a.1.end).cmp(&(&b.0, b.1.start, b.1.end)));
    let mut out: Vec<(String, Range<u64>)> = Vec::new();
    for (file, r) in ranges {
        match out.last_mut() {
            Some((f, last))
                if *f == file && r.start <= last.end && r.end.max(last.end) - last.start <= max_run =>
            {
                last.end = last.end.max(r.end);
            }
            _ => out.push((file, r)),
        }
    }
    out
}

/// Choose the top `top` of `ranked` (hottest first) and plan the fetch of what is not local.
/// `catalog(key)` gives an expert's ranges (`None`: the install has no such expert); `is_local`
/// says whether a range is present.
pub fn plan_warm(
    ranked: &[ExpertKey],
    top: usize,
    max_run: u64,
    catalog: impl Fn(ExpertKey) -> Option<Vec<ExpertRange>>,
    is_local: impl Fn(&str, &Range<u64>) -> bool,
) -> Result<WarmPlan> {
    let selected: Vec<ExpertKey> = ranked.iter().copied().take(top).collect();
    let mut missing = Vec::new();
    let mut already_local = 0;
    for &k in &selected {
        let ranges = catalog(k).ok_or_else(|| Error::InvalidArgument {
            what: "route trace",
            input: format!("layer {} expert {}", k.layer, k.expert),
            reason: "this install has no such routed expert (was the trace recorded with another model?)"
                .into(),
        })?;
        let before = missing.len();
        missing.extend(
            ranges
                .into_iter()
                .map(|r| (r.file, r.start..r.end))
                .filter(|(f, r)| !is_local(f, r)),
        );
        already_local += usize::from(missing.len() == before);
    }
    Ok(WarmPlan {
        selected,
        already_local,
        runs: coalesce(missing, max_run),
    })
}

/// Plan against `store` and fetch with `workers` threads. A complete (`full`) install needs
/// nothing.
pub fn warm(
    store: &StreamStore,
    ranked: &[ExpertKey],
    top: usize,
    max_run: u64,
    workers: usize,
) -> Result<WarmReport> {
    let started = Instant::now();
    let before = store.stats();
    if store.mode() == Mode::Full {
        return Ok(WarmReport {
            selected: top.min(ranked.len()),
            already_local: top.min(ranked.len()),
            ..WarmReport::default()
        });
    }
    let plan = plan_warm(
        ranked,
        top,
        max_run,
        |k| {
            store
                .expert_ranges(k.layer, k.expert)
                .map(<[ExpertRange]>::to_vec)
        },
        |f, r| store.is_local(f, r),
    )?;
    let next = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..workers.clamp(1, plan.runs.len().max(1)) {
            s.spawn(|| {
                while first_error.lock().expect("lock").is_none() {
                    let Some((file, r)) = plan.runs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                        return;
                    };
                    if let Err(e) = store.ensure_range(file, r.clone()) {
                        first_error.lock().expect("lock").get_or_insert(e);
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().expect("lock") {
        return Err(e);
    }
    let after = store.stats();
    Ok(WarmReport {
        selected: plan.selected.len(),
        already_local: plan.already_local,
        fetched: plan.selected.len() - plan.already_local,
        requests: plan.runs.len(),
        bytes: after.bytes - before.bytes,
        files_published: after.files_published - before.files_published,
        seconds: started.elapsed().as_secs_f64(),
        ..WarmReport::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(layer: u32, expert: u32) -> ExpertKey {
        ExpertKey { layer, expert }
    }

    fn range(layer: u32, expert: u32, file: &str, start: u64, end: u64) -> ExpertRange {
        ExpertRange {
            layer,
            expert,
            file: file.into(),
            start,
            end,
        }
    }

    #[test]
    fn touching_ranges_merge_up_to_the_cap_and_files_stay_apart() {
        let r = |f: &str, a, b| (f.to_string(), a..b);
        let got = coalesce(
            vec![
                r("b", 0, 10),
                r("a", 20, 30),
                r("a", 10, 20),
                r("a", 40, 50),
                r("a", 30, 35),
            ],
            20,
        );
        assert_eq!(
            got,
            vec![r("a", 10, 30), r("a", 30, 35), r("a", 40, 50), r("b", 0, 10)]
        );
        assert_eq!(coalesce(vec![r("a", 0, 100)], 10), vec![r("a", 0, 100)]);
    }

    #[test]
    fn plan_takes_the_top_n_skips_local_experts_and_rejects_unknown_ones() {
        let catalog = |k: ExpertKey| match (k.layer, k.expert) {
            (1, e) if e < 4 => Some(vec![range(1, e, "s", 100 * e as u64, 100 * e as u64 + 100)]),
            _ => None,
        };
        let local = |_: &str, r: &Range<u64>| r.start == 100; // expert 1 is local
        let ranked = [key(1, 2), key(1, 1), key(1, 3), key(1, 0)];
        let p = plan_warm(&ranked, 3, 1 << 20, catalog, local).unwrap();
        assert_eq!(p.selected, vec![key(1, 2), key(1, 1), key(1, 3)]);
        assert_eq!(p.already_local, 1);
        assert_eq!(
            p.runs,
            vec![("s".to_string(), 200..400)],
            "experts 2 and 3 touch: one request"
        );
        let e = plan_warm(&[key(9, 9)], 1, 1 << 20, catalog, local).unwrap_err();
        assert!(e.to_string().contains("layer 9 expert 9"), "{e}");
    }
}
