#!/usr/bin/env bash
# The decode cost of verifying every weight read against the install's checksums
# (`--verify-weights on` against `off`), interleaved in one run, in memory and under a cgroup v1
# memory limit. Run as root on an otherwise idle machine, on a model with recorded checksums:
#
#   deltafin doctor --dir MODEL --write-checksums
#   DELTAFIN=target/release/deltafin MODEL=/work/.bench-cache/dsv3-bench bench/verify.sh
#
# In memory: `bench run` with a budget larger than the model (every expert ends up resident, so
# steady-state decode reads nothing; the reads of the warm-up are verified). Under the limit:
# `--memory-budget auto` inside a fresh cgroup (bench/cgrun.sh), where every missed expert is
# read, and verified, on the reader threads. Prints decode tok/s per arm and the on/off ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${BENCH_CACHE:-/work/.bench-cache}
MODEL=${MODEL:-$CACHE/dsv3-bench}
DELTAFIN=${DELTAFIN:-target/release/deltafin}
ROUNDS=${ROUNDS:-3}
LIMIT_GIB=${LIMIT_GIB:-4}
INMEM_BUDGET=${INMEM_BUDGET:-20G}
OUT=${OUT:-$CACHE/results/verify-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
echo "results in $OUT" >&2
test -f "$MODEL/.deltafin/checksums.json" || { echo "no checksums: deltafin doctor --dir $MODEL --write-checksums" >&2; exit 1; }
uptime > "$OUT/uptime-start.txt"
for r in $(seq "$ROUNDS"); do
  for v in off on; do
    "$DELTAFIN" bench run --model "$MODEL" --memory-budget "$INMEM_BUDGET" --prompt-tokens 16 \
      --warmup-tokens 40 --decode-tokens 32 --verify-weights "$v" --label "in-memory verify=$v r$r" --json \
      >> "$OUT/inmem.jsonl" 2>> "$OUT/inmem.err"
  done
done
for r in $(seq "$ROUNDS"); do
  for v in off on; do
    bench/cgrun.sh $((LIMIT_GIB << 30)) "verify-$v" "$DELTAFIN" bench run --model "$MODEL" --memory-budget auto \
      --prompt-tokens 16 --warmup-tokens 6 --decode-tokens 16 --verify-weights "$v" \
      --label "${LIMIT_GIB}GiB verify=$v r$r" --json >> "$OUT/limit.jsonl" 2>> "$OUT/limit.err"
  done
done
uptime > "$OUT/uptime-end.txt"
python3 - "$OUT" <<'PY'
import json, sys, collections
out = sys.argv[1]
for name in ("inmem", "limit"):
    arms = collections.defaultdict(list)
    for line in open(f"{out}/{name}.jsonl"):
        r = json.loads(line)
        d = r["decode"]
        arms[r["label"].split(" r")[0]].append(d["tokens_per_second"])
        print("%-28s decode %.3f tok/s, reads %.2f GiB/s, load %.2f s"
              % (r["label"], d["tokens_per_second"], d["read_gib_per_second"], r["load_seconds"]))
    on = [v for k, vs in arms.items() if k.endswith("verify=on") for v in vs]
    off = [v for k, vs in arms.items() if k.endswith("verify=off") for v in vs]
    if on and off:
        print("%s: on/off mean %.3f (on %.3f-%.3f, off %.3f-%.3f)"
              % (name, sum(on) / len(on) / (sum(off) / len(off)), min(on), max(on), min(off), max(off)))
PY
