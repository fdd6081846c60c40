#!/usr/bin/env bash
# Prefill beside llama.cpp (see docs/performance.md, "Prefill"). Run as root on a cgroup v1 host,
# on an otherwise idle machine:
#
#   DELTAFIN=target/release/deltafin bench/prefill.sh
#
# 1. writes the ~12.5 GB synthetic DeepSeek-V3-architecture model (dsv3-bench, with a 32k
#    context so 16k prompts fit) if absent, and its BF16 GGUF with llama.cpp's converter
#    (bench/setup-llama.sh builds llama.cpp into $BENCH_CACHE);
# 2. probes the disk with the engine's read pattern (`deltafin bench disk`);
# 3. in memory (no limit, page cache warm): `deltafin bench prefill --memory-budget off` and
#    `llama-bench -p LENGTHS -n 0` (mmap, the weights in page cache);
# 4. under a LIMIT_GIB cgroup v1 memory limit (page cache charged to it, dropped first):
#    `deltafin bench prefill --memory-budget auto` (the budget is the cgroup's) with the disk's
#    bandwidth for the I/O bound, and llama-bench the same way;
# 5. writes summary.md (tok/s per length, the ratio to llama.cpp, and to the I/O bound).
#
# ARMS=memory or ARMS=limit runs one arm only; LIMIT_LENGTHS (default LENGTHS) sets the lengths
# of the limit arm. llama-bench runs without its warm-up pass (the script warms the page cache
# itself; a prompt-processing warm-up would double the run's time and change nothing measured).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${BENCH_CACHE:-/work/.bench-cache}
MODEL=${MODEL:-$CACHE/dsv3-bench-32k}
GGUF=${GGUF:-$MODEL-bf16.gguf}
LENGTHS=${LENGTHS:-1024,4096,16384}
LIMIT_LENGTHS=${LIMIT_LENGTHS:-$LENGTHS}
ARMS=${ARMS:-memory limit}
LIMIT_GIB=${LIMIT_GIB:-4}
THREADS=${THREADS:-2}
DELTAFIN=${DELTAFIN:-target/release/deltafin}
LLAMA=${LLAMA:-$CACHE/llama_cpp_python-0.3.36/vendor/llama.cpp}
PY=${PY:-$CACHE/venv/bin/python}
OUT=${OUT:-$CACHE/results/prefill-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
echo "results in $OUT" >&2
uptime > "$OUT/uptime-start.txt"
cat /proc/cpuinfo | awk -F': ' '/model name/ {print $2; exit}' > "$OUT/cpu.txt"

[ -f "$MODEL/config.json" ] ||
  "$DELTAFIN" synth --out "$MODEL" --preset dsv3-bench --max-position 32768 --shards 4 --json > "$OUT/synth.json"
if [ -x "$LLAMA/build/bin/llama-bench" ] && [ ! -f "$GGUF" ]; then
  "$PY" bench/gguf_convert.py "$LLAMA" "$MODEL" "$GGUF" > "$OUT/convert.log" 2>&1
fi
[ -f "$GGUF" ] || echo "no GGUF ($GGUF): run bench/setup-llama.sh first; llama.cpp arms skipped" >&2

sync; echo 3 > /proc/sys/vm/drop_caches
"$DELTAFIN" bench disk --model "$MODEL" --json --threads 1,4,8 > "$OUT/disk.json"
DISK=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["best_direct_gib_s"])' "$OUT/disk.json")
echo "disk (direct, best in-flight count): $DISK GiB/s" >&2

llama() { # llama NAME LENGTHS [cgrun args...]: llama-bench at every length
  local name=$1 lengths=$2; shift 2
  [ -f "$GGUF" ] || return 0
  "$@" "$LLAMA/build/bin/llama-bench" -m "$GGUF" -p "$lengths" -n 0 -t "$THREADS" -r 1 --no-warmup -o json \
    > "$OUT/llama-$name.json" 2>> "$OUT/llama.err" || echo "llama $name failed" >&2
}

# In memory: warm the page cache once (both engines map or read the same bytes), then run.
if [[ " $ARMS " == *" memory "* ]]; then
  cat "$MODEL"/*.safetensors > /dev/null
  "$DELTAFIN" --threads "$THREADS" bench prefill --model "$MODEL" --memory-budget off --lengths "$LENGTHS" \
    --label "deltafin in memory" --json > "$OUT/ours-memory.json" 2>> "$OUT/ours.err"
  [ -f "$GGUF" ] && cat "$GGUF" > /dev/null
  llama memory "$LENGTHS"
fi

# Under the limit: each run in a fresh cgroup with the page cache dropped.
if [[ " $ARMS " == *" limit "* ]]; then
  limit=$((LIMIT_GIB << 30))
  bench/cgrun.sh "$limit" "prefill-ours" "$DELTAFIN" --threads "$THREADS" bench prefill --model "$MODEL" \
    --memory-budget auto --lengths "$LIMIT_LENGTHS" --disk-gib-s "$DISK" --label "deltafin ${LIMIT_GIB} GiB" \
    --json > "$OUT/ours-limit.json" 2>> "$OUT/ours.err"
  llama limit "$LIMIT_LENGTHS" bench/cgrun.sh "$limit" "prefill-llama"
fi

uptime > "$OUT/uptime-end.txt"
python3 bench/summarize_prefill.py "$OUT" "$LIMIT_GIB" | tee "$OUT/summary.md"
