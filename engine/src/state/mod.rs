//! Per-sequence model state and its transactions (below the layers that fill it and the
//! generation loops that drive it: it imports neither).
//!
//! A [`SeqState`] holds one entry per layer: the compressed MLA cache ([`MlaCache`]: the
//! normalised latent and the shared key part of every position) or the KDA recurrent state
//! ([`KdaCache`]: short-convolution history and the delta-rule matrix per head).
//!
//! ## Transactions
//! Every forward pass over `rows` new tokens of a sequence is **staged**: afterwards
//! [`SeqState::len`] includes those rows and the next pass continues after them, but the pass
//! can still be cut back:
//! * [`SeqState::commit`]`(m)` keeps the first `m` rows of the staged pass (`0 ≤ m ≤ rows`) and
//!   drops the rest; the state is then exactly the state of having run only those `m` rows, one
//!   at a time (bit-identical: see below). [`SeqState::commit_all`] keeps every row and
//!   [`SeqState::rollback`] none.
//! * Starting another pass commits the previous one entirely, so callers that never use
//!   transactions (plain generation) see the old "a pass appends" behaviour.
//!
//! Speculative decoding runs `[t, d1 … dk]` in one pass, compares predictions, and commits the
//! accepted prefix `m + 1`.
//!
//! How it is done: MLA caches only append, so committing `m` rows truncates them. A KDA layer
//! keeps **one** snapshot of its pre-pass state (the convolution history is copied; the
//! recurrent matrix is not: its buffer is swapped out and the pass's first step reads it out of
//! place) and each row's recurrence inputs (the raw q/k/v projections, the normalised
//! `k`, `v`, the log-decay `g` and `β`: `6·P + heads` floats, far less than a state copy per
//! row). `commit(m)` with `m` equal to the pass length keeps the live state; otherwise it swaps
//! the snapshot back in and replays `m` rows with the same two functions the forward pass uses
//! ([`recurrence::conv_push`], [`recurrence::delta_rule_step`]), so the result is bit-identical by construction.
//!
//! ## Rewinding committed positions
//! [`SeqState::truncate`] drops committed positions: attention caches are cut, and recurrent
//! layers are restored from a [`SeqState::checkpoint`] taken at that position (see
//! `checkpoint`); [`SeqState::rewind_point`] says how far back a state can go.

use std::sync::Arc;

mod checkpoint;
pub mod paged;
pub mod recurrence;

use self::checkpoint::Checkpoint;
pub use self::paged::{BLOCK_POSITIONS, Paged, Rows};
use self::paged::{writable, zeros};
use self::recurrence as kda;
pub use self::recurrence::KdaShape;

use crate::error::{Error, Result};

/// The compressed MLA cache of one layer: the normalised latent `c_kv` and the shared key part
/// `k_rope` (rotated, or raw for NoPE attention) of every position (never expanded per head), in
/// shared blocks ([`paged`]).
#[derive(Debug, Clone, Default)]
pub struct MlaCache {
    /// `kv_lora_rank` values per position.
    pub latent: Paged,
    /// `qk_rope_head_dim` values per position.
    pub k_rope: Paged,
    /// `index_head_dim` values per position: the DSA indexer's keys (empty on dense MLA layers
    /// and on layers sharing another layer's selection).
    pub index_keys: Paged,
}

impl MlaCache {
    fn truncate(&mut self, len: usize) {
        self.latent.truncate(len);
        self.k_rope.truncate(len);
        self.index_keys.truncate(len);
    }

    fn parts(&self) -> [&Paged; 3] {
        [&self.latent, &self.k_rope, &self.index_keys]
    }
}

/// The cache of one DeepSeek-V4 attention layer (`model::layers::compressed`), in shared blocks:
/// the rotated K=V row of every position (the sliding window reads the last ones), the
/// compressor's inputs of every position (kv and gate projections, so a window's entry is
/// recomputed the same whatever the chunking and a truncation is exact), and the compressed
/// entries, one per `ratio` positions, each written when its window closes; likewise the
/// lightning indexer's inputs and keys.
#[derive(Debug, Clone, Default)]
pub struct CompressedCache {
    /// `head_dim` values per position.
    pub kv: Paged,
    /// The compressor's kv then gate projections per position (empty: sliding window only).
    pub inputs: Paged,
    /// `head_dim` values per closed window.
    pub entries: Paged,
    /// The indexer's compressor inputs per position (empty: no indexer).
    pub index_inputs: Paged,
    /// `index_head_dim` values per closed window.
    pub index_keys: Paged,
    /// Positions per compressed entry (0: no compressor).
    pub ratio: usize,
    /// Positions the sliding window reads.
    pub window: usize,
}

impl CompressedCache {
    /// An empty cache compressing every `ratio` positions (0: none) behind a sliding window of
    /// `window` positions.
    pub fn new(ratio: usize, window: usize) -> Self {
        CompressedCache {
            ratio,
            window,
            ..Default::default()
        }
    }

    /// The first position whose kv (the window of a row at `len`) and whose compressor inputs
    /// (the window an entry after `len` pools, and the one before it) a state of `len`
    /// positions reads.
    fn reads_from(&self, len: usize) -> (usize, usize) {
        let kv = len.saturating_sub(self.window);
        let inputs = match self.ratio {
            0 => len,
            r => (len / r).saturating_sub(1) * r,
        };
        (kv, inputs)
    }

    /// Release the positions a state of `len` positions no longer reads: the compressed
    /// history is the entries, and kv and compressor inputs are held for the sliding window and
    /// the open windows only.
    fn trim(&mut self, len: usize) {
        let (kv, inputs) = self.reads_from(len);
        self.kv.forget_before(kv);
        self.inputs.forget_before(inputs);
        self.index_inputs.forget_before(inputs);
    }

    /// Whether the positions a state cut back to `len` reads are still held.
    fn can_truncate(&self, len: usize) -> bool {
        let (kv, inputs) = self.reads_from(len);
        len == 0
            || (kv >= self.kv.held_from()
                && inputs >= self.inputs.held_from().max(self.index_inputs.held_from()))
    }

    fn truncate(&mut self, len: usize) {
        for p in [&mut self.kv, &mut self.inputs, &mut self.index_inputs] {
            p.truncate(len);
        }
        let windows = len.checked_div(self.ratio).unwrap_or(0);
        self.entries.truncate(windows);
        self.index_keys.truncate(windows);
    }

    /// The window parts a checkpoint keeps (their blocks shared).
    fn snapshot(&self) -> [Paged; 3] {
        [self.kv.clone(), self.inputs.clone(), self.index_inputs.clone()]
    }

    /// Back to a checkpoint of `len` positions: its window parts, the entries truncated.
    fn restore(&mut self, window: &[Paged; 3], len: usize) {
        [self.kv, self.inputs, self.index_inputs] = window.clone();
        self.truncate(len);
    }

    fn parts(&self) -> [&Paged; 5] {
        [
            &self.kv,
            &self.inputs,
            &self.entries,
            &self.index_inputs,
            &self.index_keys,
        ]
    }
}

/// A standard per-head key/value cache (grouped-query attention, Qwen3): the rotated keys and
/// the values of every position, `kv_heads * head_dim` values per position each, in shared
/// blocks ([`paged`]).
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    pub k: Paged,
    pub v: Paged,
}

impl KvCache {
    fn truncate(&mut self, len: usize) {
        self.k.truncate(len);
        self.v.truncate(len);
    }
}

/// The recurrent state of one KDA layer, with its staged pass.
///
/// The delta-rule matrix is shared, never copied whole: a clone (the reuse cache, a choice of an
/// `n > 1` request) and a checkpoint hold the same buffer, and a pass writes its new state into
/// a buffer only this state holds (the spare left by the previous pass, or a new one), reading
/// the shared pre-pass matrix out of place. Every write goes through [`paged::writable`].
#[derive(Debug)]
pub struct KdaCache {
    shape: KdaShape,
    /// Raw projections of the last `K - 1` positions, oldest first, `[K-1, 3P]`.
    conv: Vec<f32>,
    /// Delta-rule state `[heads, dk, dv]`.
    recurrent: Arc<[f32]>,
    /// The pre-pass state while a pass is staged. Between passes `snapshot_recurrent` is the
    /// spare buffer the next pass writes into (when nothing else holds it).
    snapshot_conv: Vec<f32>,
    snapshot_recurrent: Arc<[f32]>,
    /// The live `recurrent` buffer is stale until the pass's first step writes it.
    first_step_pending: bool,
    /// Recurrence inputs of the staged rows, `record_len` floats each.
    inputs: Vec<f32>,
    staged: bool,
}

impl Clone for KdaCache {
    /// Shares the recurrent matrices; a committed state leaves its spare buffer behind.
    fn clone(&self) -> Self {
        let (snapshot_conv, snapshot_recurrent) = if self.staged {
            (self.snapshot_conv.clone(), Arc::clone(&self.snapshot_recurrent))
        } else {
            (Vec::new(), zeros(0))
        };
        KdaCache {
            shape: self.shape,
            conv: self.conv.clone(),
            recurrent: Arc::clone(&self.recurrent),
            snapshot_conv,
            snapshot_recurrent,
            first_step_pending: self.first_step_pending,
            inputs: self.inputs.clone(),
            staged: self.staged,
        }
    }
}

impl KdaCache {
    /// A zero state.
    pub fn new(shape: KdaShape) -> Self {
        KdaCache {
            shape,
            conv: vec![0.0; shape.conv_len()],
            recurrent: zeros(shape.state_len()),
            snapshot_conv: Vec::new(),
            snapshot_recurrent: zeros(0),
            first_step_pending: false,
            inputs: Vec::new(),
            staged: false,
        }
    }

    /// The state's shape.
    pub fn shape(&self) -> KdaShape {
        self.shape
    }

    /// Start (or continue) the staged pass: the first call of a pass keeps the pre-pass state
    /// (a copy of the small convolution history; the recurrent matrix by moving it aside, the
    /// live buffer being the spare when only this state holds it, else a new one).
    pub(crate) fn begin_rows(&mut self) {
        if !self.staged {
            self.snapshot_conv.clone_from(&self.conv);
            std::mem::swap(&mut self.recurrent, &mut self.snapshot_recurrent);
            let len = self.shape.state_len();
            if self.recurrent.len() != len || Arc::get_mut(&mut self.recurrent).is_none() {
                self.recurrent = zeros(len);
            }
            self.first_step_pending = true;
            self.inputs.clear();
            self.staged = true;
        }
    }

    /// Set the committed delta-rule state (tests of the recurrence).
    #[cfg(test)]
    pub(crate) fn restore_for_test(&mut self, recurrent: &[f32]) {
        writable(&mut self.recurrent).copy_from_slice(recurrent);
    }

    /// The staged pass's recurrent state for a head-split recurrence: the pre-pass matrix to
    /// read out of place while the pass's first step is pending, and the live buffer. Call
    /// [`KdaCache::pass_steps_done`] once the rows have stepped.
    pub(crate) fn pass_states(&mut self) -> (Option<&[f32]>, &mut [f32]) {
        debug_assert!(self.staged, "begin_rows first");
        let prev = self.first_step_pending.then_some(&self.snapshot_recurrent[..]);
        (prev, writable(&mut self.recurrent))
    }

    /// The staged rows have stepped: the live buffer holds the state.
    pub(crate) fn pass_steps_done(&mut self) {
        self.first_step_pending = false;
    }

    pub(crate) fn conv_history(&self) -> &[f32] {
        &self.conv
    }

    pub(crate) fn conv_history_mut(&mut self) -> &mut [f32] {
        &mut self.conv
    }

    /// Append one staged row's recurrence inputs.
    pub(crate) fn record(&mut self, row: &[f32]) {
        debug_assert_eq!(row.len(), self.shape.record_len());
        self.inputs.extend_from_slice(row);
    }

    /// Rows staged in the current pass.
    fn staged_rows(&self) -> usize {
        if self.staged {
            self.inputs.len() / self.shape.record_len()
        } else {
            0
        }
    }

    /// Keep the first `keep` staged rows (see the module docs).
    fn commit(&mut self, keep: usize) {
        if !self.staged {
            return;
        }
        let rows = self.staged_rows();
        debug_assert!(keep <= rows);
        if keep < rows || self.first_step_pending {
            std::mem::swap(&mut self.conv, &mut self.snapshot_conv);
            std::mem::swap(&mut self.recurrent, &mut self.snapshot_recurrent);
            let s = self.shape;
            let p = s.channels();
            if keep > 0 {
                let recurrent = writable(&mut self.recurrent);
                for row in self.inputs.chunks(s.record_len()).take(keep) {
                    let (raw, rest) = row.split_at(3 * p);
                    let (k, rest) = rest.split_at(p);
                    let (v, rest) = rest.split_at(p);
                    let (g, beta) = rest.split_at(p);
                    kda::conv_push(&mut self.conv, raw, s);
                    kda::delta_rule_step(recurrent, kda::StepInputs { k, v, g, beta }, s);
                }
            }
        }
        self.inputs.clear();
        self.staged = false;
        self.first_step_pending = false;
    }

    /// The committed convolution history (a copy: it is small) and recurrent matrix (shared)
    /// (nothing may be staged).
    fn snapshot(&self) -> (Vec<f32>, Arc<[f32]>) {
        debug_assert!(!self.staged, "commit before taking a checkpoint");
        (self.conv.clone(), Arc::clone(&self.recurrent))
    }

    /// Replace the committed state with a checkpoint's (nothing may be staged).
    fn restore(&mut self, conv: &[f32], recurrent: &Arc<[f32]>) {
        debug_assert!(!self.staged, "commit before restoring a checkpoint");
        self.conv.clear();
        self.conv.extend_from_slice(conv);
        self.recurrent = Arc::clone(recurrent);
    }

    /// Bytes of live state: the convolution history and recurrent matrix, and the pass's
    /// pre-pass copies (kept between passes as the spare).
    pub fn state_bytes(&self) -> usize {
        4 * (self.conv.len()
            + self.recurrent.len()
            + self.snapshot_conv.len()
            + self.snapshot_recurrent.len())
    }

    /// Each allocation's identity and bytes (the shared matrices by their address).
    fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize)) {
        for v in [&self.conv, &self.snapshot_conv] {
            f(v.as_ptr() as usize, 4 * v.len());
        }
        for a in [&self.recurrent, &self.snapshot_recurrent] {
            f(a.as_ptr() as usize, 4 * a.len());
        }
    }
}

/// State of one layer.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LayerState {
    /// Softmax attention over the compressed latent cache.
    Mla(MlaCache),
    /// Kimi Delta Attention's recurrent state.
    Kda(KdaCache),
    /// Per-head keys and values (dense GQA models such as the Qwen3 drafter).
    Kv(KvCache),
    /// DeepSeek-V4's sliding-window and compressed caches.
    Compressed(CompressedCache),
}

impl LayerState {
    /// The MLA cache, if this is an MLA layer.
    pub fn mla_mut(&mut self) -> Option<&mut MlaCache> {
        match self {
            LayerState::Mla(c) => Some(c),
            _ => None,
        }
    }

    /// The KDA state, if this is a KDA layer.
    pub fn kda_mut(&mut self) -> Option<&mut KdaCache> {
        match self {
            LayerState::Kda(c) => Some(c),
            _ => None,
        }
    }

    /// The compressed cache, if this is a DeepSeek-V4 attention layer.
    pub fn compressed_mut(&mut self) -> Option<&mut CompressedCache> {
        match self {
            LayerState::Compressed(c) => Some(c),
            _ => None,
        }
    }

    /// The key/value cache, if this is a GQA layer.
    pub fn kv_mut(&mut self) -> Option<&mut KvCache> {
        match self {
            LayerState::Kv(c) => Some(c),
            _ => None,
        }
    }
}

/// Everything a sequence carries between passes.
#[derive(Debug, Clone)]
pub struct SeqState {
    pub(crate) layers: Vec<LayerState>,
    /// Positions processed, including the staged pass.
    pub(crate) len: usize,
    /// Rows of the last pass that are not committed yet.
    pub(crate) staged: usize,
    /// Recurrent-state checkpoints at committed positions, oldest first (empty for models
    /// without KDA layers).
    /// Shared with clones: a checkpoint never changes.
    checkpoints: Vec<Arc<Checkpoint>>,
    /// Which state this is (a clone is another state) and how many passes it has begun: a copy
    /// of the state kept elsewhere (a device's mirror of its attention caches) is current while
    /// both match.
    id: StateId,
    passes: u64,
}

/// A state's identity: unique in the process, and a clone gets a new one.
#[derive(Debug)]
struct StateId(u64);

impl StateId {
    fn fresh() -> StateId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        StateId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Clone for StateId {
    fn clone(&self) -> StateId {
        StateId::fresh()
    }
}

impl SeqState {
    /// A fresh state with the given layer states.
    pub fn new(layers: Vec<LayerState>) -> Self {
        SeqState {
            layers,
            len: 0,
            staged: 0,
            checkpoints: Vec::new(),
            id: StateId::fresh(),
            passes: 0,
        }
    }

    /// This state's identity: unique in the process; a clone has its own.
    pub fn id(&self) -> u64 {
        self.id.0
    }

    /// Passes begun on this state. Positions below [`SeqState::committed_len`] change only by
    /// a pass or by being cut off, so a copy of them taken after pass `k` is still the state's
    /// own (up to its current length) while `passes()` is `k`.
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Number of positions processed, including a staged (not yet committed) pass: the next
    /// pass starts at this position.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position has been processed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions that are committed (excluding the staged pass).
    pub fn committed_len(&self) -> usize {
        self.len - self.staged
    }

    /// Rows of the last pass that can still be cut back (0 when nothing is staged).
    pub fn staged_rows(&self) -> usize {
        self.staged
    }

    /// Keep the first `keep` rows of the staged pass and drop the rest.
    pub fn commit(&mut self, keep: usize) -> Result<()> {
        if keep > self.staged {
            return Err(Error::InvalidArgument {
                field: "commit",
                reason: format!("cannot keep {keep} rows: the staged pass has {}", self.staged),
            });
        }
        let new_len = self.committed_len() + keep;
        for layer in &mut self.layers {
            match layer {
                LayerState::Mla(c) => c.truncate(new_len),
                LayerState::Kda(c) => c.commit(keep),
                LayerState::Kv(c) => c.truncate(new_len),
                LayerState::Compressed(c) => {
                    c.truncate(new_len);
                    c.trim(new_len);
                }
            }
        }
        self.len = new_len;
        self.staged = 0;
        Ok(())
    }

    /// Keep every staged row.
    pub fn commit_all(&mut self) {
        self.commit(self.staged)
            .expect("keeping every staged row is always valid");
    }

    /// Drop the whole staged pass.
    pub fn rollback(&mut self) {
        self.commit(0).expect("keeping no row is always valid");
    }

    /// Start a pass over `rows` new positions: commits the previous pass, then stages these.
    pub(crate) fn begin_pass(&mut self, rows: usize) {
        self.commit_all();
        self.len += rows;
        self.staged = rows;
        self.passes += 1;
    }

    /// Whether any layer holds a recurrent (KDA) state, which cannot be rewound without a
    /// checkpoint.
    pub fn has_recurrent_layers(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Kda(_)))
    }

    /// Whether rewinding into committed positions needs a checkpoint for some layer: a recurrent
    /// (KDA) state, or a compressed cache that keeps only its window.
    fn needs_checkpoints(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerState::Kda(_) | LayerState::Compressed(_)))
    }

    /// Checkpoint the committed recurrent state (and compressed layers' windows) at the current
    /// position (commits a staged pass first), keeping at most `max` checkpoints
    /// ([`checkpoint::thin`] picks which to drop). A no-op for models without KDA or compressed
    /// layers, at position 0, or when one exists here already.
    pub fn checkpoint(&mut self, max: usize) {
        self.commit_all();
        let position = self.len;
        if max == 0 || position == 0 || !self.needs_checkpoints() {
            return;
        }
        if self.checkpoints.last().is_some_and(|c| c.position >= position) {
            return;
        }
        let layers = self
            .layers
            .iter()
            .filter_map(|l| match l {
                LayerState::Kda(c) => Some(c.snapshot()),
                _ => None,
            })
            .collect();
        let windows = self
            .layers
            .iter()
            .filter_map(|l| match l {
                LayerState::Compressed(c) => Some(c.snapshot()),
                _ => None,
            })
            .collect();
        self.checkpoints.push(Arc::new(Checkpoint {
            position,
            layers,
            windows,
        }));
        while let Some(i) = checkpoint::thin(&self.checkpoint_positions(), max) {
            self.checkpoints.remove(i);
        }
    }

    /// Checkpoints held.
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints.len()
    }

    /// Positions of the checkpoints held, oldest first.
    pub fn checkpoint_positions(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|c| c.position).collect()
    }

    /// The longest prefix `<= len` this state can be rolled back to: `len` itself within the
    /// staged pass or when no layer is recurrent; otherwise the latest checkpoint at or before
    /// `len` (0 when there is none: nothing reusable).
    pub fn rewind_point(&self, len: usize) -> usize {
        let len = len.min(self.len);
        if len >= self.committed_len() {
            return len;
        }
        let compressed_hold = self.layers.iter().all(|l| match l {
            LayerState::Compressed(c) => c.can_truncate(len),
            _ => true,
        });
        if compressed_hold && !self.has_recurrent_layers() {
            return len;
        }
        checkpoint::at_or_before(&self.checkpoint_positions(), len)
            .map_or(0, |i| self.checkpoints[i].position)
    }

    /// Whether [`SeqState::truncate`]`(len)` would succeed: always within the staged pass; for
    /// committed positions when no layer is recurrent or a checkpoint is held at `len`.
    pub fn can_truncate(&self, len: usize) -> bool {
        len >= self.len || self.rewind_point(len) == len
    }

    /// Forget every position at or after `len` (no-op if `len >= self.len()`). Positions of
    /// the staged pass can always be dropped; committed positions when every layer is an
    /// attention cache, or at a checkpoint (the recurrent layers are restored from it).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        if len >= self.committed_len() {
            return self.commit(len - self.committed_len());
        }
        if !self.can_truncate(len) {
            return Err(Error::InvalidArgument {
                field: "truncate",
                reason: format!(
                    "recurrent (KDA) state can only be rewound within the staged pass (to >= {}) \
                     or to a checkpoint ({:?}), not to {len}",
                    self.committed_len(),
                    self.checkpoint_positions()
                ),
            });
        }
        self.commit_all();
        self.checkpoints.retain(|c| c.position <= len);
        let restore = self.checkpoints.last().filter(|c| c.position == len);
        let mut kda = restore.map(|c| c.layers.iter());
        let mut windows = restore.map(|c| c.windows.iter());
        for layer in &mut self.layers {
            match layer {
                LayerState::Mla(c) => c.truncate(len),
                LayerState::Kv(c) => c.truncate(len),
                LayerState::Compressed(c) => match windows.as_mut().and_then(Iterator::next) {
                    Some(window) if !c.can_truncate(len) => c.restore(window, len),
                    _ => c.truncate(len),
                },
                LayerState::Kda(c) => {
                    let (conv, recurrent) = kda
                        .as_mut()
                        .and_then(Iterator::next)
                        .expect("can_truncate checked for a checkpoint of every KDA layer");
                    c.restore(conv, recurrent);
                }
            }
        }
        self.len = len;
        Ok(())
    }

    /// Each allocation the state holds, by identity (blocks and shared matrices by their address,
    /// so what two states share is counted once) and bytes.
    pub fn for_each_allocation(&self, f: &mut dyn FnMut(usize, usize)) {
        for layer in &self.layers {
            match layer {
                LayerState::Mla(c) => c.parts().iter().for_each(|p| p.for_each_block(f)),
                LayerState::Kv(c) => [&c.k, &c.v].iter().for_each(|p| p.for_each_block(f)),
                LayerState::Compressed(c) => c.parts().iter().for_each(|p| p.for_each_block(f)),
                LayerState::Kda(c) => c.for_each_allocation(f),
            }
        }
        for c in &self.checkpoints {
            c.for_each_allocation(f);
        }
    }

    /// Bytes held by recurrent-state checkpoints.
    pub fn checkpoint_bytes(&self) -> usize {
        self.checkpoints.iter().map(|c| c.bytes()).sum()
    }

    /// Bytes held by caches, recurrent states and their checkpoints.
    pub fn cache_bytes(&self) -> usize {
        self.mla_cache_bytes() + self.kda_state_bytes() + self.checkpoint_bytes()
    }

    /// Bytes held by the attention caches (MLA latents, per-head keys and values; grows with
    /// the context).
    pub fn mla_cache_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Mla(c) => c.parts().iter().map(|p| p.bytes()).sum(),
                LayerState::Kv(c) => c.k.bytes() + c.v.bytes(),
                LayerState::Compressed(c) => c.parts().iter().map(|p| p.bytes()).sum(),
                LayerState::Kda(_) => 0,
            })
            .sum()
    }

    /// Bytes of KDA recurrent state (constant in the context length).
    pub fn kda_state_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kda(c) => c.state_bytes(),
                LayerState::Mla(_) | LayerState::Kv(_) | LayerState::Compressed(_) => 0,
            })
            .sum()
    }

    /// Number of MLA layers.
    pub fn mla_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l, LayerState::Mla(_)))
            .count()
    }
}
