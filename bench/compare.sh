#!/usr/bin/env bash
# The standard out-of-core comparison (see docs/performance.md). Run as root on a cgroup v1
# host, on an otherwise idle machine:
#
#   DELTAFIN=target/release/deltafin bench/compare.sh
#
# 1. writes the ~12.5 GB synthetic DeepSeek-V3-architecture model (uniform routing) if absent;
# 2. converts it to BF16 GGUF with llama.cpp's converter (bench/setup-llama.sh builds llama.cpp
#    from the llama-cpp-python sdist into $BENCH_CACHE);
# 3. probes the disk with the engine's own read pattern (`deltafin bench disk`), before and after;
# 4. in memory (no limit, page cache warm): deltafin (`bench run` with a budget larger than the
#    model, so every expert ends up resident) and llama-bench interleaved, INMEM_REPEATS times,
#    INMEM_DECODE tokens each (eight tokens of llama-bench vary by a third between runs);
# 5. for each memory limit (GiB): drops the page cache and runs, each inside a fresh cgroup v1
#    memory child with that limit, deltafin (LRU with prefetch, LRU without, LFU with) and
#    llama.cpp's llama-bench (default mmap loading; two run lengths give bytes per token);
# 6. writes summary.md (every ratio: deltafin / llama.cpp, / the I/O bound, read / ideal) next
#    to the raw JSON and logs.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${BENCH_CACHE:-/work/.bench-cache}
MODEL=${MODEL:-$CACHE/dsv3-bench}
GGUF=${GGUF:-$MODEL-bf16.gguf}
LIMITS=${LIMITS:-"8 4 2"}
ARMS=${ARMS:-"lru lru-noprefetch lfu"}
DECODE=${DECODE:-16}
WARMUP=${WARMUP:-6}
LLAMA_N=${LLAMA_N:-8}
DELTAFIN=${DELTAFIN:-target/release/deltafin}
INMEM_REPEATS=${INMEM_REPEATS:-2}
INMEM_BUDGET=${INMEM_BUDGET:-20G}
INMEM_WARMUP=${INMEM_WARMUP:-40}
INMEM_DECODE=${INMEM_DECODE:-32}
LLAMA=${LLAMA:-$CACHE/llama_cpp_python-0.3.36/vendor/llama.cpp}
PY=${PY:-$CACHE/venv/bin/python}
OUT=${OUT:-$CACHE/results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
echo "results in $OUT" >&2
uptime > "$OUT/uptime-start.txt"

[ -f "$MODEL/config.json" ] || "$DELTAFIN" synth --out "$MODEL" --preset dsv3-bench --shards 4 --json > "$OUT/synth.json"
if [ -x "$LLAMA/build/bin/llama-bench" ] && [ ! -f "$GGUF" ]; then
  "$PY" bench/gguf_convert.py "$LLAMA" "$MODEL" "$GGUF" > "$OUT/convert.log" 2>&1
fi

disk_probe() {
  sync; echo 3 > /proc/sys/vm/drop_caches
  "$DELTAFIN" bench disk --model "$MODEL" --json --threads 1,4,8 > "$OUT/disk-$1.json"
}
disk_probe before
DISK=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["best_direct_gib_s"])' "$OUT/disk-before.json")
echo "disk (direct, best in-flight count): $DISK GiB/s" >&2

# In memory: nothing limited; each program's weights warm before its run (the model's shards and
# the GGUF do not both fit in the page cache of a 24 GiB machine, so each is warmed in turn).
for r in $(seq "$INMEM_REPEATS"); do
  "$DELTAFIN" bench run --model "$MODEL" --memory-budget "$INMEM_BUDGET" --prompt-tokens 16 \
    --warmup-tokens "$INMEM_WARMUP" --decode-tokens "$INMEM_DECODE" --label "deltafin in-memory r$r" --json \
    >> "$OUT/inmem-ours.jsonl" 2>> "$OUT/inmem-ours.err" || echo "ours in-memory $r failed" >&2
  if [ -f "$GGUF" ]; then
    cat "$GGUF" > /dev/null
    "$LLAMA/build/bin/llama-bench" -m "$GGUF" -p 0 -n "$INMEM_DECODE" -t 2 -r 1 -o json \
      > "$OUT/inmem-llama-$r.json" 2>> "$OUT/llama.err" || echo "llama in-memory $r failed" >&2
  fi
done

for g in $LIMITS; do
  limit=$((g << 30))
  for arm in $ARMS; do
    flags="--cache-policy ${arm%%-*}"
    [ "$arm" = "${arm%-noprefetch}" ] || flags="$flags --no-prefetch"
    # shellcheck disable=SC2086
    bench/cgrun.sh "$limit" "ours-$g-$arm" "$DELTAFIN" bench run --model "$MODEL" --memory-budget auto $flags \
      --prompt-tokens 16 --warmup-tokens "$WARMUP" --decode-tokens "$DECODE" --disk-gib-s "$DISK" \
      --io-replay --label "deltafin $arm ${g}GiB" --json >> "$OUT/ours.jsonl" 2>> "$OUT/ours.err" || echo "ours $g $arm failed" >&2
  done
  if [ -f "$GGUF" ]; then
    for n in 2 $((2 + LLAMA_N)); do
      bench/cgrun.sh "$limit" "llama-$g-$n" "$LLAMA/build/bin/llama-bench" -m "$GGUF" -p 0 -n "$n" -t 2 -r 1 -o json \
        > "$OUT/llama-$g-$n.json" 2>> "$OUT/llama.err" || echo "llama $g $n failed" >&2
    done
  fi
done
disk_probe after
uptime > "$OUT/uptime-end.txt"
python3 bench/summarize.py "$OUT" "$LLAMA_N" | tee "$OUT/summary.md"
