#!/usr/bin/env bash
# Speculative decoding at controlled acceptance rates (docs/speculative.md):
#
#   DELTAFIN=target/release/deltafin bench/spec.sh
#
# Runs `deltafin bench spec` on the synthetic MoE model of `deltafin bench serve` (generated into
# the cache directory on first use), once with every weight in memory and once under a memory
# budget that streams routed experts from disk (run inside a cgroup v1 memory child when run as
# root on a cgroup v1 host, so the page cache cannot hide the disk). Proposers: n-gram, a draft
# head made for the model, and the Qwen3 drafter fixture (a different tokenizer). Writes the
# tables and JSON under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
DELTAFIN=${DELTAFIN:-target/release/deltafin}
QWEN=${QWEN:-engine/tests/fixtures/qwen3}
TOKENS=${TOKENS:-192}
BUDGET=${BUDGET:-96M}
OUT=${OUT:-bench/results/spec-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
common=(bench spec --draft-qwen "$QWEN" --tokens "$TOKENS")
uptime > "$OUT/uptime.txt"
echo "== in memory" | tee "$OUT/memory.txt"
"$DELTAFIN" "${common[@]}" --memory-budget off | tee -a "$OUT/memory.txt"
"$DELTAFIN" "${common[@]}" --memory-budget off --json > "$OUT/memory.json"
echo "== in memory, routing locality 1 (the rows of a verify pass share experts, as real text's do)" | tee "$OUT/memory-local.txt"
"$DELTAFIN" "${common[@]}" --memory-budget off --route-locality 1 | tee -a "$OUT/memory-local.txt"
echo "== experts streaming from disk (budget $BUDGET)" | tee "$OUT/disk.txt"
run=("$DELTAFIN" "${common[@]}" --memory-budget "$BUDGET" --read-mode direct)
if [ "$(id -u)" = 0 ] && [ -d /sys/fs/cgroup/memory ]; then
    limit=$(( $(numfmt --from=iec "${BUDGET%B}") + (256 << 20) ))
    bench/cgrun.sh "$limit" spec "${run[@]}" | tee -a "$OUT/disk.txt"
else
    "${run[@]}" | tee -a "$OUT/disk.txt"
fi
"${run[@]}" --json > "$OUT/disk.json"
uptime >> "$OUT/uptime.txt"
echo "results in $OUT" >&2
