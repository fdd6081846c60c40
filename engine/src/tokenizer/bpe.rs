//! Rank-based byte-pair encoding (tiktoken semantics): repeatedly merge the adjacent pair whose
//! concatenation has the lowest rank, the leftmost pair on ties, until no pair is a token.
//!
//! Two implementations with identical results: a quadratic scan for short pieces (the common
//! case, no allocation beyond one small vector) and a heap with lazy invalidation for long ones.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Pieces longer than this many bytes use the heap-based merge.
const HEAP_THRESHOLD: usize = 96;

/// A small multiplicative hasher for byte-string keys (the default SipHash dominates BPE time).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Byte string -> rank.
pub(crate) type RankMap = HashMap<Vec<u8>, u32, BuildHasherDefault<FastHasher>>;

/// Encode one pre-tokenized piece, appending ranks to `out`. Every byte must have a rank (the
/// loader checks that all 256 single bytes are present); a byte without one is skipped.
pub(crate) fn encode_piece(ranks: &RankMap, piece: &[u8], out: &mut Vec<u32>) {
    if piece.is_empty() {
        return;
    }
    if let Some(&r) = ranks.get(piece) {
        out.push(r);
        return;
    }
    let bounds = if piece.len() > HEAP_THRESHOLD {
        merge_heap(ranks, piece)
    } else {
        merge_scan(ranks, piece)
    };
    out.extend(
        bounds
            .windows(2)
            .filter_map(|w| ranks.get(&piece[w[0]..w[1]]).copied()),
    );
}

fn rank_of(ranks: &RankMap, bytes: &[u8]) -> u32 {
    ranks.get(bytes).copied().unwrap_or(u32::MAX)
}

/// Quadratic merge: `bounds` holds part starts plus the end; `pair[i]` the rank of parts i, i+1.
pub(crate) fn merge_scan(ranks: &RankMap, piece: &[u8]) -> Vec<usize> {
    let mut bounds: Vec<usize> = (0..=piece.len()).collect();
    let mut pair: Vec<u32> = (0..piece.len().saturating_sub(1))
        .map(|i| rank_of(ranks, &piece[i..i + 2]))
        .collect();
    loop {
        let mut best = (u32::MAX, 0usize);
        for (i, &r) in pair.iter().enumerate() {
            if r < best.0 {
                best = (r, i);
            }
        }
        if best.0 == u32::MAX {
            return bounds;
        }
        let i = best.1;
        // Merge parts i and i+1: drop the boundary between them.
        bounds.remove(i + 1);
        pair.remove(i);
        if i < pair.len() {
            pair[i] = rank_of(ranks, &piece[bounds[i]..bounds[i + 2]]);
        }
        if i > 0 {
            pair[i - 1] = rank_of(ranks, &piece[bounds[i - 1]..bounds[i + 1]]);
        }
    }
}

/// Heap merge over a linked list of parts; entries are validated when popped.
pub(crate) fn merge_heap(ranks: &RankMap, piece: &[u8]) -> Vec<usize> {
    let n = piece.len();
    // Part k starts at byte k while alive; next[k] is the start of the following part (or n).
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|k| k.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    let mut heap: BinaryHeap<Reverse<(u32, usize, usize)>> = BinaryHeap::with_capacity(n);
    let push = |heap: &mut BinaryHeap<_>, left: usize, next: &[usize]| {
        let mid = next[left];
        if mid < n {
            let end = next[mid];
            let r = rank_of(ranks, &piece[left..end]);
            if r != u32::MAX {
                heap.push(Reverse((r, left, end)));
            }
        }
    };
    for k in 0..n {
        push(&mut heap, k, &next);
    }
    while let Some(Reverse((_, left, end))) = heap.pop() {
        let mid = next[left];
        if !alive[left] || mid >= n || next[mid] != end {
            continue; // stale: a part changed since this entry was pushed
        }
        alive[mid] = false;
        next[left] = end;
        if end < n {
            prev[end] = left;
        }
        push(&mut heap, left, &next);
        let p = prev[left];
        if p < n {
            push(&mut heap, p, &next);
        }
    }
    let mut bounds = Vec::new();
    let mut k = 0;
    while k < n {
        bounds.push(k);
        k = next[k];
    }
    bounds.push(n);
    bounds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(tokens: &[&[u8]]) -> RankMap {
        let mut m = RankMap::default();
        for b in 0..=255u8 {
            m.insert(vec![b], u32::from(b));
        }
        for (i, t) in tokens.iter().enumerate() {
            m.insert(t.to_vec(), 256 + i as u32);
        }
        m
    }

    #[test]
    fn scan_and_heap_agree() {
        let ranks = table(&[
            b"ab", b"aa", b"bb", b"aab", b"abab", b"ba", b"aaaa", b"bab", b"abb",
        ]);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 1..300 {
            let piece: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    if seed.is_multiple_of(3) { b'b' } else { b'a' }
                })
                .collect();
            assert_eq!(
                merge_scan(&ranks, &piece),
                merge_heap(&ranks, &piece),
                "len {len}"
            );
        }
    }

    #[test]
    fn leftmost_on_ties() {
        let ranks = table(&[b"aa"]);
        assert_eq!(merge_scan(&ranks, b"aaa"), vec![0, 2, 3]);
        assert_eq!(merge_heap(&ranks, b"aaa"), vec![0, 2, 3]);
    }
}
