//! Spine residency: a store of per-layer weights (`T` = an architecture's layer struct without
//! its routed experts). Layers of the resident prefix are read once at start into their own
//! buffers; the others are read every pass through two arena buffers, the next streamed
//! layer's read being submitted as soon as a layer is handed out, so it overlaps that layer's
//! compute (and, after the last layer, the head and the next pass's resident layers).
//!
//! Layers are built by the architecture's own loading function over a [`BufferSource`], so a
//! streamed layer is bit-for-bit the layer that an all-resident load builds.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::buffer::AlignedBuf;
use super::reader::{Priority, ReaderPool, Ticket};
use super::source::BufferSource;
use super::spans::SpanLayout;
use crate::config::Checkpoint;
use crate::error::Result;
use crate::model::Loader;
use crate::sync::lock;
use crate::weights::WeightIndex;

/// Builds layer `i` from a loader.
pub type LayerBuilder<T> = Arc<dyn Fn(&Loader<'_>, usize) -> Result<T> + Send + Sync>;

/// Counters of the spine store.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpineStats {
    /// Layer uses served from resident memory, and their bytes.
    pub resident_uses: u64,
    pub resident_bytes: u64,
    /// Streamed layer uses, and the bytes read for them.
    pub streamed_uses: u64,
    pub streamed_bytes: u64,
    /// Seconds blocked waiting for a streamed layer.
    pub wait_seconds: f64,
    /// Times an arena buffer was still referenced and a fresh one had to be allocated.
    pub arena_reallocations: u64,
}

enum Entry<T> {
    Resident(Arc<T>, u64),
    Streamed(SpanLayout),
}

struct Arena {
    bufs: [Arc<AlignedBuf>; 2],
    loaded: [Option<(usize, Ticket)>; 2],
}

struct Streamer<T> {
    index: Arc<WeightIndex>,
    spec: Checkpoint,
    build: LayerBuilder<T>,
    reader: Arc<ReaderPool>,
    streamed: Vec<usize>,
    arena: Mutex<Arena>,
    /// Layer `i`'s bytes are blob id `ids + i` in whichever arena buffer holds them
    /// ([`crate::weights::Blob::identified`]): a device keeps one copy of a streamed layer.
    ids: u64,
}

/// Per-layer weights, resident or streamed.
pub struct LayerStore<T> {
    entries: Vec<Entry<T>>,
    streamer: Option<Streamer<T>>,
    stats: Mutex<SpineStats>,
}

impl<T> std::fmt::Debug for LayerStore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resident = self
            .entries
            .iter()
            .filter(|e| matches!(e, Entry::Resident(..)))
            .count();
        write!(f, "LayerStore({resident} resident of {})", self.entries.len())
    }
}

impl<T> LayerStore<T> {
    /// All layers already built (the in-memory / memory-mapped model).
    pub fn resident(layers: Vec<T>) -> Self {
        LayerStore {
            entries: layers
                .into_iter()
                .map(|l| Entry::Resident(Arc::new(l), 0))
                .collect(),
            streamer: None,
            stats: Mutex::new(SpineStats::default()),
        }
    }

    /// Layers `0..resident` read now into their own buffers; the rest streamed per pass.
    /// `layouts[i]` is layer `i`'s read set.
    pub fn load(
        index: Arc<WeightIndex>,
        spec: Checkpoint,
        build: LayerBuilder<T>,
        reader: Arc<ReaderPool>,
        layouts: Vec<SpanLayout>,
        resident: usize,
    ) -> Result<Self> {
        let mut entries = Vec::with_capacity(layouts.len());
        let mut streamed = Vec::new();
        let mut arena_len = 0usize;
        for (i, layout) in layouts.into_iter().enumerate() {
            if i < resident {
                let buf = Arc::new(AlignedBuf::new(layout.total)?);
                reader.read_layout_now(buf.clone(), &layout)?;
                let t = build_over((&index, &spec, &build), buf, &layout, (i, None))?;
                entries.push(Entry::Resident(Arc::new(t), layout.payload));
            } else {
                arena_len = arena_len.max(layout.total);
                streamed.push(i);
                entries.push(Entry::Streamed(layout));
            }
        }
        let streamer = if streamed.is_empty() {
            None
        } else {
            let bufs = [
                Arc::new(AlignedBuf::new(arena_len)?),
                Arc::new(AlignedBuf::new(arena_len)?),
            ];
            Some(Streamer {
                index,
                spec,
                build,
                reader,
                streamed,
                arena: Mutex::new(Arena {
                    bufs,
                    loaded: [None, None],
                }),
                ids: crate::weights::Blob::reserve_ids(entries.len() as u64),
            })
        };
        Ok(LayerStore {
            entries,
            streamer,
            stats: Mutex::new(SpineStats::default()),
        })
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Counters so far.
    pub fn stats(&self) -> SpineStats {
        lock(&self.stats).clone()
    }

    /// Layer `i`'s weights. For a streamed layer this waits for its read and submits the next
    /// streamed layer's; drop the returned value before asking for the layer after next.
    pub fn get(&self, i: usize) -> Result<Arc<T>> {
        match &self.entries[i] {
            Entry::Resident(t, bytes) => {
                let mut s = lock(&self.stats);
                s.resident_uses += 1;
                s.resident_bytes += bytes;
                Ok(t.clone())
            }
            Entry::Streamed(_) => self.get_streamed(i),
        }
    }

    fn layout(&self, i: usize) -> &SpanLayout {
        match &self.entries[i] {
            Entry::Streamed(l) => l,
            Entry::Resident(..) => unreachable!("only streamed layers have arena layouts"),
        }
    }

    /// Submit layer `i`'s read into arena buffer `b`, replacing the buffer if a previous
    /// layer built over it is still alive.
    fn submit(&self, st: &Streamer<T>, arena: &mut Arena, b: usize, i: usize) {
        if let Some((_, pending)) = arena.loaded[b].take() {
            let _ = pending.wait(); // a read still writing into this buffer must finish first
        }
        if Arc::strong_count(&arena.bufs[b]) > 1 {
            let len = arena.bufs[b].len();
            if let Ok(fresh) = AlignedBuf::new(len) {
                arena.bufs[b] = Arc::new(fresh);
                lock(&self.stats).arena_reallocations += 1;
            }
        }
        let layout = self.layout(i);
        let t = st
            .reader
            .submit_layout(arena.bufs[b].clone(), layout, Priority::Demand, None);
        arena.loaded[b] = Some((i, t));
    }

    fn get_streamed(&self, i: usize) -> Result<Arc<T>> {
        let st = self.streamer.as_ref().expect("streamed layers have a streamer");
        let mut arena = lock(&st.arena);
        let b = match arena
            .loaded
            .iter()
            .position(|l| l.as_ref().is_some_and(|(x, _)| *x == i))
        {
            Some(b) => b,
            None => {
                // Not read ahead (first pass, or out of order): read into a buffer that does
                // not hold the read-ahead of another layer if possible.
                let b = arena.loaded.iter().position(|l| l.is_none()).unwrap_or(0);
                self.submit(st, &mut arena, b, i);
                b
            }
        };
        let (_, ticket) = arena.loaded[b].take().expect("just found");
        let start = Instant::now();
        ticket.wait()?;
        let waited = start.elapsed().as_secs_f64();
        let buf = arena.bufs[b].clone();
        let pos = st.streamed.iter().position(|&x| x == i).expect("streamed");
        let next = st.streamed[(pos + 1) % st.streamed.len()];
        let other = 1 - b;
        if arena.loaded[other].as_ref().is_none_or(|(x, _)| *x != next) {
            self.submit(st, &mut arena, other, next);
        }
        drop(arena);
        let layout = self.layout(i);
        let t = build_over(
            (&st.index, &st.spec, &st.build),
            buf,
            layout,
            (i, Some(st.ids + i as u64)),
        )?;
        let mut s = lock(&self.stats);
        s.streamed_uses += 1;
        s.streamed_bytes += layout.read_bytes();
        s.wait_seconds += waited;
        Ok(Arc::new(t))
    }
}

/// Layer `i` built over `buf` (read per `layout`), its blobs named `identity` if given.
fn build_over<T>(
    (index, spec, build): (&WeightIndex, &Checkpoint, &LayerBuilder<T>),
    buf: Arc<AlignedBuf>,
    layout: &SpanLayout,
    (i, identity): (usize, Option<u64>),
) -> Result<T> {
    let source = BufferSource {
        owner: buf,
        layout,
        identity,
    };
    let ld = Loader::new(index, spec)
        .with_source(&source)
        .with_routed_experts(false);
    build(&ld, i)
}
