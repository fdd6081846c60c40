#!/usr/bin/env bash
# `deltafin plan` against measurements (docs/performance.md, "What will my box do"):
#
#   DELTAFIN=target/release/deltafin bench/plan-check.sh
#   PLAN_ARGS="--route-trace TRACE" …   # hits from a measured routing (deltafin plan --help)
#
# At each memory limit in $LIMITS, on the `bench serve` model (or $MODEL): the prediction of
# `deltafin plan` (this machine's disk and cores, measured by plan itself; no context memory
# planned, as `bench serve` plans none), then `bench serve` at the same budget and streams and
# `bench prefill` of one $PREFILL-token prompt in one pass, and the ratio measured / predicted.
# Each limit runs its plan right before its measurements, so a drifting disk affects both.
# Writes the JSON of every run and a table under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
DELTAFIN=${DELTAFIN:-target/release/deltafin}
LIMITS=${LIMITS:-80M 110M 200M}
STREAMS=${STREAMS:-1,8}
TOKENS=${TOKENS:-32}
PREFILL=${PREFILL:-1024}
OUT=${OUT:-bench/results/plan-$(date -u +%Y%m%dT%H%M%SZ)}
model=()
[ -n "${MODEL:-}" ] && model=(--model "$MODEL")
mkdir -p "$OUT"
uptime > "$OUT/uptime.txt"
for limit in $LIMITS; do
    # shellcheck disable=SC2086 # PLAN_ARGS: extra plan flags, e.g. `--route-trace FILE`
    "$DELTAFIN" plan "${model[@]}" --ram "$limit" --context-memory 0 --streams "$STREAMS" \
        --prefill-tokens "$PREFILL" ${PLAN_ARGS:-} --json > "$OUT/plan-$limit.json"
    # The model plan used (the `bench serve` model when none is given; `bench prefill` would
    # default to another one).
    model=(--model "$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["model"])' "$OUT/plan-$limit.json")")
    "$DELTAFIN" bench serve "${model[@]}" --memory-budget "$limit" --streams "$STREAMS" \
        --tokens "$TOKENS" --json > "$OUT/serve-$limit.json" 2> "$OUT/serve-$limit.log"
    "$DELTAFIN" bench prefill "${model[@]}" --memory-budget "$limit" --lengths "$PREFILL" \
        --chunk "$PREFILL" --json > "$OUT/prefill-$limit.json" 2> "$OUT/prefill-$limit.log"
done
uptime >> "$OUT/uptime.txt"
python3 - "$OUT" $LIMITS <<'EOF' | tee "$OUT/table.md"
import json, sys
out, limits = sys.argv[1], sys.argv[2:]
print("| limit | pass | streams | cache | disk GB/s (plan) | predicted tok/s | measured tok/s | measured / predicted |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
worst = 0.0
for limit in limits:
    plan = json.load(open(f"{out}/plan-{limit}.json"))
    serve = json.load(open(f"{out}/serve-{limit}.json"))
    for level in serve["levels"]:
        s = level["streams"]
        p = next(p for p in plan["predictions"] if p["kind"] == "decode" and p["streams"] == s)
        ratio = level["aggregate_tokens_per_second"] / p["tokens_per_second"]
        worst = max(worst, abs(ratio - 1.0))
        print(f"| {limit} | decode | {s} | {100 * plan['plan']['cache_fraction']:.1f} % "
              f"| {plan['disk_bytes_per_second']['value'] / 1e9:.2f} | {p['tokens_per_second']:.1f} "
              f"| {level['aggregate_tokens_per_second']:.1f} | {ratio:.2f} |")
    prefill = json.load(open(f"{out}/prefill-{limit}.json"))["points"][0]
    p = next(p for p in plan["predictions"] if p["kind"] == "prefill" and p["streams"] == 1)
    ratio = prefill["tokens_per_second"] / p["tokens_per_second"]
    worst = max(worst, abs(ratio - 1.0))
    print(f"| {limit} | prefill {prefill['tokens']} | 1 | {100 * plan['plan']['cache_fraction']:.1f} % "
          f"| {plan['disk_bytes_per_second']['value'] / 1e9:.2f} | {p['tokens_per_second']:.1f} "
          f"| {prefill['tokens_per_second']:.1f} | {ratio:.2f} |")
print(f"\nlargest deviation: {100 * worst:.0f} %")
EOF
echo "results in $OUT" >&2
