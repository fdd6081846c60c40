#!/usr/bin/env python3
"""Expert reads per token under the optimal offline cache (Belady's MIN, with bypass) against
LRU, on route traces written by `deltafin bench serve --streams S --route-trace FILE`.

Issue 37 asks that disk bytes per token at 2/4/8 streams never exceed the 1-stream figure. This
computes, for the same routes, the fewest expert reads any cache of C slots could make, so a
level where even MIN reads more per token than one stream does is a level no policy can bring
under the 1-stream figure with that cache.

Usage: min_misses.py SLOTS WARMUP_PASSES TOKENS_PER_STREAM S=FILE [S=FILE ...]
The first WARMUP_PASSES passes (bench serve's one-stream warm-up) fill the cache but are not
counted; reads in the remaining passes are divided by S * TOKENS_PER_STREAM.
"""
import json
import sys
from collections import OrderedDict


def accesses(path):
    out = []
    for i, line in enumerate(open(path)):
        p = json.loads(line)
        for r in p["routes"]:
            for e in r["experts"]:
                out.append((i, (r["layer"], e)))
    return out


def lru(seq, slots, counted):
    cache, misses = OrderedDict(), 0
    for p, key in seq:
        if key in cache:
            cache.move_to_end(key)
            continue
        misses += counted(p)
        cache[key] = True
        if len(cache) > slots:
            cache.popitem(last=False)
    return misses


def belady(seq, slots, counted):
    """MIN with bypass: on a miss, keep the slots whose next use is soonest, the new key included."""
    nxt, last = [0] * len(seq), {}
    for i in range(len(seq) - 1, -1, -1):
        key = seq[i][1]
        nxt[i] = last.get(key, float("inf"))
        last[key] = i
    cache, misses = {}, 0  # key -> next use
    for i, (p, key) in enumerate(seq):
        if key in cache:
            cache[key] = nxt[i]
            continue
        misses += counted(p)
        cache[key] = nxt[i]
        if len(cache) > slots:
            far = max(cache, key=cache.get)
            del cache[far]
    return misses


def main():
    slots, warm, per_stream = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    print(f"{'streams':>7} {'tokens':>6} {'LRU reads/tok':>14} {'MIN reads/tok':>14} {'MIN vs 1 stream':>16}")
    base = None
    for arg in sys.argv[4:]:
        s, path = arg.split("=", 1)
        s = int(s)
        seq = accesses(path)
        counted = lambda p: 1 if p >= warm else 0
        tokens = s * per_stream
        l, m = lru(seq, slots, counted) / tokens, belady(seq, slots, counted) / tokens
        base = base or m
        print(f"{s:>7} {tokens:>6} {l:>14.2f} {m:>14.2f} {m / base:>16.2f}")


if __name__ == "__main__":
    main()
