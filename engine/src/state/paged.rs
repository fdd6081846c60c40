//! Paged context memory: one component of an attention cache (a layer's MLA latents, its shared
//! rotated keys, its indexer keys, or its per-head keys or values) as fixed-size blocks of
//! [`BLOCK_POSITIONS`] positions.
//!
//! * **Allocation is exact.** A block is allocated whole when its first position is written and
//!   never grows, so a component holding `n` positions owns `⌈n / B⌉ · B · width` floats: the
//!   figure the context-memory plan counts (`StateSize::bytes` in the architecture module), never a `Vec`'s
//!   doubling capacity.
//! * **Sharing is by reference.** Blocks are reference counted: cloning a cache (the reuse cache
//!   keeping a conversation, a reused prefix, the choices of an `n > 1` request) copies pointers,
//!   not positions. A block is written only through [`writable`], which copies it first when
//!   another holder shares it (copy on write), so a holder's positions never change under it.
//!   Truncation only forgets blocks; the tail block is copied at the next write if it is shared.
//! * **Reads are unchanged.** Kernels read position `j` as one `width`-float slice ([`Rows`]),
//!   whether it lives in blocks or in one flat slice (tests, drafts' scratch): the values and the
//!   order they are read in do not depend on the layout, so outputs are bit-identical.
//!
//! [`Paged::for_each_block`] names each block by its address, so the holders of shared blocks
//! can be counted once (the reuse cache's exclusive bytes).

use std::sync::Arc;

/// Positions per block (a multiple of the indexer's 16-key tiles, so a tile never straddles two
/// blocks).
pub const BLOCK_POSITIONS: usize = 64;

/// Positions rounded up to whole blocks: what a component holding `positions` allocates.
pub fn block_positions(positions: usize) -> usize {
    positions.div_ceil(BLOCK_POSITIONS) * BLOCK_POSITIONS
}

/// Rows of `width` floats per position, in shared fixed-size blocks.
#[derive(Debug, Clone, Default)]
pub struct Paged {
    /// Floats per position (set by the first row written).
    width: usize,
    /// Positions held.
    len: usize,
    /// Blocks `first..⌈len / B⌉` of `B · width` floats; positions past `len` in the last are
    /// unused.
    blocks: Vec<Arc<[f32]>>,
    /// Leading blocks forgotten ([`Paged::forget_before`]): positions below `first · B` are no
    /// longer held.
    first: usize,
}

/// `buf` for writing: replaced by a copy first when another holder shares it (the copy on
/// write of cache blocks and recurrent matrices).
pub(crate) fn writable(buf: &mut Arc<[f32]>) -> &mut [f32] {
    if Arc::get_mut(buf).is_none() {
        *buf = Arc::from(&buf[..]);
    }
    Arc::get_mut(buf).expect("a buffer just copied has one holder")
}

/// `n` zeros in one shared allocation (collected from an exact-size iterator: no `Vec` first
/// and no copy).
pub(crate) fn zeros(n: usize) -> Arc<[f32]> {
    std::iter::repeat_n(0.0, n).collect()
}

impl Paged {
    /// Rows `rows` (`width` floats each) in blocks (tests and fixtures).
    pub fn from_rows(rows: &[f32], width: usize) -> Self {
        let mut p = Paged::default();
        p.extend(rows, width);
        p
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Floats per position (0 before the first row).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Append one position.
    pub fn push(&mut self, row: &[f32]) {
        if self.blocks.is_empty() {
            self.width = row.len();
        }
        debug_assert_eq!(row.len(), self.width, "every position has the same width");
        let (b, r) = (
            self.len / BLOCK_POSITIONS - self.first,
            self.len % BLOCK_POSITIONS,
        );
        if b == self.blocks.len() {
            self.blocks.push(zeros(BLOCK_POSITIONS * self.width));
        }
        writable(&mut self.blocks[b])[r * self.width..][..self.width].copy_from_slice(row);
        self.len += 1;
    }

    /// Append consecutive positions of `width` floats each.
    pub fn extend(&mut self, rows: &[f32], width: usize) {
        if width == 0 {
            return;
        }
        for row in rows.chunks_exact(width) {
            self.push(row);
        }
    }

    /// Forget every position at or after `len` (all of them when `len` is below what is still
    /// held: [`Paged::held_from`]).
    pub fn truncate(&mut self, len: usize) {
        if len < self.held_from() {
            debug_assert_eq!(len, 0, "truncated below the positions still held");
            *self = Paged::default();
        } else if len < self.len {
            self.len = len;
            self.blocks.truncate(len.div_ceil(BLOCK_POSITIONS) - self.first);
        }
    }

    /// Stop holding the whole blocks below position `pos` (a sliding window's old positions);
    /// reading them afterwards is a bug.
    pub fn forget_before(&mut self, pos: usize) {
        let keep_from = (pos.min(self.len) / BLOCK_POSITIONS).max(self.first);
        self.blocks.drain(..keep_from - self.first);
        self.first = keep_from;
    }

    /// The first position still held (0 unless [`Paged::forget_before`] dropped blocks).
    pub fn held_from(&self) -> usize {
        self.first * BLOCK_POSITIONS
    }

    /// Position `j`'s floats.
    #[inline(always)]
    pub fn row(&self, j: usize) -> &[f32] {
        debug_assert!(j < self.len && j >= self.held_from());
        &self.blocks[j / BLOCK_POSITIONS - self.first][(j % BLOCK_POSITIONS) * self.width..][..self.width]
    }

    /// Positions `lo..hi` as one slice; they must lie in one block.
    pub fn span(&self, lo: usize, hi: usize) -> &[f32] {
        debug_assert!(lo < hi && hi <= self.len && lo >= self.held_from());
        let b = lo / BLOCK_POSITIONS;
        assert_eq!((hi - 1) / BLOCK_POSITIONS, b, "a span lies inside one block");
        let r = lo % BLOCK_POSITIONS;
        &self.blocks[b - self.first][r * self.width..(r + hi - lo) * self.width]
    }

    /// Bytes allocated: whole blocks.
    pub fn bytes(&self) -> usize {
        4 * self.blocks.len() * BLOCK_POSITIONS * self.width
    }

    /// Each block's identity (its address) and bytes.
    pub fn for_each_block(&self, f: &mut dyn FnMut(usize, usize)) {
        let bytes = 4 * BLOCK_POSITIONS * self.width;
        for b in &self.blocks {
            f(b.as_ptr() as usize, bytes);
        }
    }

    /// Every held position's floats, in order (tests).
    pub fn to_vec(&self) -> Vec<f32> {
        (self.held_from()..self.len)
            .flat_map(|j| self.row(j).iter().copied())
            .collect()
    }
}

/// A read-only run of positions: blocks, or one flat slice of `width`-float positions.
#[derive(Debug, Clone, Copy)]
pub enum Rows<'a> {
    Flat(&'a [f32]),
    Paged(&'a Paged),
}

impl<'a> Rows<'a> {
    /// Positions held, at `width` floats each.
    pub fn len(self, width: usize) -> usize {
        match self {
            Rows::Flat(s) => s.len() / width.max(1),
            Rows::Paged(p) => p.len(),
        }
    }

    /// Position `j`'s `width` floats.
    #[inline(always)]
    pub fn row(self, j: usize, width: usize) -> &'a [f32] {
        match self {
            Rows::Flat(s) => &s[j * width..][..width],
            Rows::Paged(p) => {
                debug_assert_eq!(p.width(), width);
                p.row(j)
            }
        }
    }

    /// Positions `lo..hi` as one slice (for blocks: inside one block).
    pub fn span(self, lo: usize, hi: usize, width: usize) -> &'a [f32] {
        match self {
            Rows::Flat(s) => &s[lo * width..hi * width],
            Rows::Paged(p) => p.span(lo, hi),
        }
    }

    /// Whether `self` and `other` are the same storage.
    pub fn same(self, other: Rows<'_>) -> bool {
        match (self, other) {
            (Rows::Flat(a), Rows::Flat(b)) => a.as_ptr() == b.as_ptr() && a.len() == b.len(),
            (Rows::Paged(a), Rows::Paged(b)) => std::ptr::eq(a, b),
            _ => false,
        }
    }
}

impl<'a> From<&'a [f32]> for Rows<'a> {
    fn from(s: &'a [f32]) -> Self {
        Rows::Flat(s)
    }
}

impl<'a> From<&'a Vec<f32>> for Rows<'a> {
    fn from(s: &'a Vec<f32>) -> Self {
        Rows::Flat(s)
    }
}

impl<'a> From<&'a Paged> for Rows<'a> {
    fn from(p: &'a Paged) -> Self {
        Rows::Paged(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, width: usize, seed: f32) -> Vec<f32> {
        (0..n * width).map(|i| seed + i as f32).collect()
    }

    #[test]
    fn positions_read_back_across_blocks_and_allocation_is_whole_blocks() {
        let data = rows(150, 3, 0.0);
        let p = Paged::from_rows(&data, 3);
        assert_eq!((p.len(), p.width()), (150, 3));
        assert_eq!(p.to_vec(), data);
        assert_eq!(p.row(64), &data[192..195]);
        assert_eq!(
            p.bytes(),
            4 * 3 * 3 * BLOCK_POSITIONS,
            "150 positions: three blocks"
        );
        assert_eq!(p.span(64, 80), &data[192..240]);
        let flat = Rows::from(&data);
        for j in [0, 63, 64, 149] {
            assert_eq!(Rows::from(&p).row(j, 3), flat.row(j, 3));
        }
        assert_eq!(block_positions(0), 0);
        assert_eq!(block_positions(1), 64);
        assert_eq!(block_positions(128), 128);
    }

    #[test]
    fn a_clone_shares_blocks_and_a_write_copies_only_the_shared_tail() {
        let mut a = Paged::from_rows(&rows(100, 2, 0.0), 2);
        let b = a.clone();
        let ids = |p: &Paged| {
            let mut v = Vec::new();
            p.for_each_block(&mut |id, _| v.push(id));
            v
        };
        assert_eq!(ids(&a), ids(&b), "a clone copies no position");
        a.push(&[-1.0, -2.0]);
        let (ia, ib) = (ids(&a), ids(&b));
        assert_eq!(ia[0], ib[0], "the full block stays shared");
        assert_ne!(ia[1], ib[1], "the written tail was copied");
        assert_eq!(b.to_vec(), rows(100, 2, 0.0), "the other holder is unchanged");
        assert_eq!(a.row(100), &[-1.0, -2.0]);
    }

    #[test]
    fn truncation_forgets_blocks_and_a_rewrite_never_reaches_another_holder() {
        let original = rows(130, 1, 0.0);
        let keep = Paged::from_rows(&original, 1);
        let mut cut = keep.clone();
        cut.truncate(70);
        assert_eq!((cut.len(), cut.bytes()), (70, 4 * 2 * BLOCK_POSITIONS));
        cut.push(&[1000.0]);
        assert_eq!(cut.row(70), &[1000.0]);
        assert_eq!(
            keep.to_vec(),
            original,
            "position 70 of the kept copy is unchanged"
        );
        cut.truncate(0);
        assert_eq!((cut.len(), cut.bytes()), (0, 0));
    }

    #[test]
    fn identity_tells_storages_apart() {
        let v = vec![1.0f32; 8];
        let p = Paged::from_rows(&v, 2);
        assert!(Rows::from(&v).same(Rows::from(&v)));
        assert!(Rows::from(&p).same(Rows::from(&p)));
        assert!(!Rows::from(&p).same(Rows::from(&v)));
    }

    /// A sliding window's old blocks are dropped whole; what is still held reads back as
    /// written, grows on, and truncates; truncating below it empties the rows.
    #[test]
    fn forgotten_blocks_are_released_and_the_rest_reads_back() {
        let rows: Vec<f32> = (0..300).map(|i| i as f32).collect();
        let mut p = Paged::from_rows(&rows, 1);
        p.forget_before(130);
        assert_eq!(
            (p.held_from(), p.len(), p.bytes()),
            (128, 300, 4 * 3 * BLOCK_POSITIONS)
        );
        assert_eq!(p.row(128), &[128.0]);
        assert_eq!(p.to_vec(), rows[128..]);
        p.push(&[300.0]);
        p.truncate(200);
        assert_eq!((p.len(), p.row(199)), (200, &[199.0][..]));
        p.forget_before(10);
        assert_eq!(p.held_from(), 128, "forgetting never comes back");
        p.truncate(0);
        assert_eq!((p.len(), p.bytes()), (0, 0));
    }
}
