//! One MoE layer's side of the expert store ([`LayerExperts`]): acquire the experts a step
//! selected — hits first, misses in disk-offset order with at most the reader's threads holding
//! a slot for a read — and hand each to the layer's compute as it becomes ready.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{LayerExperts, key};
use crate::cache::policy::{bypass_miss, issue_order, may_start_miss};
use crate::cache::reader::{Priority, ReadResult};
use crate::cache::slots::{Lookup, Woken};
use crate::error::{Error, Result};
use crate::model::layers::mlp::Mlp;
use crate::model::layers::moe::ExpertProvider;
use crate::sync::lock;

impl LayerExperts<'_> {
    /// Submit the demand read of expert `e` into `slot` (pinned by the caller, `Loading`).
    fn read(&self, e: usize, slot: usize) {
        let st = self.store;
        let (k, bytes) = (key(self.layer, e), st.layouts[self.layer][e].payload);
        {
            let mut s = lock(&st.stats);
            s.misses += 1;
            s.miss_bytes += bytes;
        }
        let layout = &st.layouts[self.layer][e];
        let (cache, completions) = (st.cache.clone(), st.completions.clone());
        let started = Instant::now();
        let done = Box::new(move |r: ReadResult, origin| {
            completions.completed(r.is_ok(), origin, bytes, started);
            cache.complete(slot, k, r);
        });
        let ticket = st
            .reader
            .submit_layout(st.cache.buffer(slot), layout, Priority::Demand, Some(done));
        st.cache.set_ticket(slot, ticket);
    }

    /// Pin or start reading one expert; `None` when no slot is free. `bypass`: this step
    /// over-subscribes the cache with several rows ([`super::policy::bypass_miss`]).
    fn start(&self, e: usize, bypass: bool) -> Option<usize> {
        let st = self.store;
        let k = key(self.layer, e);
        let bytes = st.layouts[self.layer][e].payload;
        let lookup = st.cache.acquire(k);
        let mut s = lock(&st.stats);
        // Read for this step (on demand or ahead of it), not kept from an earlier one.
        let (slot, read_for_step) = match &lookup {
            &Lookup::Hit { slot, speculative } => {
                if speculative {
                    s.prefetch_hits += 1;
                    s.prefetch_hit_bytes += bytes;
                } else {
                    s.hits += 1;
                    s.hit_bytes += bytes;
                }
                (slot, speculative)
            }
            Lookup::Loading { slot, ticket } => {
                if let Some(t) = ticket {
                    st.reader.promote(t);
                }
                s.prefetch_hits += 1;
                s.prefetch_hit_bytes += bytes;
                (*slot, true)
            }
            &Lookup::Miss { slot } => (slot, true),
            Lookup::Present | Lookup::NoSlot => return None,
        };
        // Never hold the stats lock while taking the pass lock (`observe` takes them the other
        // way round), nor while submitting a read.
        drop(s);
        if matches!(lookup, Lookup::Miss { .. }) {
            self.read(e, slot);
        }
        if bypass && read_for_step {
            let nth = st.bypass_reads.fetch_add(1, Ordering::Relaxed) + 1;
            if bypass_miss(nth) {
                st.cache.demote(k);
            }
        }
        Some(slot)
    }
}

impl ExpertProvider for LayerExperts<'_> {
    fn for_each_expert(&self, ids: &[usize], run: &(dyn Fn(usize, &Mlp) + Sync)) -> Result<()> {
        let helpers = self
            .store
            .config
            .compute_threads
            .saturating_sub(1)
            .min(ids.len().saturating_sub(1));
        if helpers == 0 {
            return self.dispatch(ids, &mut |e, mlp| run(e, &mlp));
        }
        // The calling thread waits for reads and hands each ready expert to the rayon pool as a
        // task, so the other workers compute while it waits; once everything is handed out it
        // computes too. (Helper threads of its own, spawned per layer, cost a thread start per
        // MoE layer, and their products ran outside the pool: every one was injected into it and
        // waited for, a futex wake-up each: dsv3-bench decode at a 20G budget went from
        // 9.30-9.63 to 10.24-10.45 tok/s, 2 interleaved rounds.)
        rayon::in_place_scope(|s| self.dispatch(ids, &mut |e, mlp| s.spawn(move |_| run(e, &mlp))))
    }
}

impl LayerExperts<'_> {
    /// Acquire every expert of `ids` (hits first, misses as their reads land) and pass each,
    /// ready, to `ready`.
    fn dispatch(&self, ids: &[usize], ready: &mut dyn FnMut(usize, Mlp)) -> Result<()> {
        let st = self.store;
        if st.layouts[self.layer].is_empty() {
            return Err(Error::InvalidArgument {
                field: "layer",
                reason: format!("layer {} has no routed experts", self.layer),
            });
        }
        st.observe(self.layer, ids);
        let bypass = {
            let p = lock(&st.pass);
            p.oversubscribed && p.step_rows > 1
        };
        {
            let mut s = lock(&st.stats);
            s.layer_steps += 1;
            s.uses += ids.len() as u64;
            s.use_bytes += ids
                .iter()
                .map(|&e| st.layouts[self.layer][e].payload)
                .sum::<u64>();
        }
        st.fetch_missing(self.layer, ids)?;
        let layouts = &st.layouts[self.layer];
        let cached = |e: usize| st.cache.contains(key(self.layer, e));
        let position = |e: usize| {
            layouts[e]
                .segments
                .first()
                .map_or((0, 0), |s| (s.shard, s.offset))
        };
        let mut pending: VecDeque<usize> = issue_order(ids, cached, position).into();
        let window = st.reader.threads();
        // (expert, slot, read on demand by this step)
        let mut inflight: Vec<(usize, usize, bool)> = Vec::new();
        let mut hinted = false;
        let mut waited = 0.0;
        let result = (|| -> Result<()> {
            loop {
                while let Some(&e) = pending.front() {
                    let miss = !cached(e);
                    let misses = inflight.iter().filter(|f| f.2).count();
                    if miss && !may_start_miss(misses, window) {
                        break;
                    }
                    let Some(slot) = self.start(e, bypass) else { break };
                    inflight.push((e, slot, miss));
                    pending.pop_front();
                }
                if !hinted {
                    hinted = true;
                    st.submit_pending(&mut lock(&st.pass));
                }
                if inflight.is_empty() {
                    if pending.is_empty() {
                        return Ok(());
                    }
                    waited += st.cache.wait_change().as_secs_f64();
                    continue;
                }
                let slots: Vec<usize> = inflight.iter().map(|&(_, s, _)| s).collect();
                let (woken, blocked) = st.cache.wait_any(&slots)?;
                waited += blocked.as_secs_f64();
                match woken {
                    Woken::Ready(i) => {
                        let (e, slot, _) = inflight.swap_remove(i);
                        let mlp = st.build_mlp(self.layer, e, st.cache.handle(slot))?;
                        ready(e, mlp);
                    }
                    Woken::Reread(i) => self.read(inflight[i].0, inflight[i].1),
                }
            }
        })();
        for (_, slot, _) in inflight {
            st.cache.unpin(slot);
        }
        lock(&st.stats).wait_seconds += waited;
        result
    }
}
