#!/usr/bin/env bash
# The new families' synth presets beside dsv3-bench in one run (issue 34's closing figures):
#   * in memory (`--memory-budget off`, every weight memory-mapped, warm page cache): prefill
#     and decode tokens/s of `deltafin run --stats`, ROUNDS rounds interleaved;
#   * out of core under one budget (`bench run`): decode tok/s and bytes read per token against
#     the ideal (`--disk-gib-s` from `deltafin bench disk`).
# Presets (write once):
#   deltafin synth --preset gpt-oss-120b --out $CACHE/gpt-oss-120b-2l   # 2 layers, 3.3 GiB
#   deltafin synth --preset minimax-m2 --out $CACHE/minimax-m2-1l        # 1 layer, 3.4 GiB
#   deltafin synth --preset qwen3.5-397b --layers 4 --experts 64 --out $CACHE/qwen3.5-397b-4l64e
#                                        # 3 DeltaNet + 1 attention layer, 64 of 512 experts, 3.5 GiB
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${BENCH_CACHE:-/work/.bench-cache}
DELTAFIN=${DELTAFIN:-target/release/deltafin}
ROUNDS=${ROUNDS:-2}
BUDGET=${BUDGET:-1500M}
DISK=${DISK_GIB_S:-2.29}
MODELS=${MODELS:-"dsv3-bench gpt-oss-120b-2l minimax-m2-1l qwen3.5-397b-4l64e"}
OUT=${OUT:-$CACHE/results/new-families-$(date -u +%Y%m%dT%H%M%SZ)}
TEXT="The licenses for most software are designed to take away your freedom to share and change it. By contrast, the GNU General Public License is intended to guarantee your freedom to share and change free software."
mkdir -p "$OUT"
echo "results in $OUT" >&2
uptime > "$OUT/uptime-start.txt"
for r in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    echo "== $m round $r" >> "$OUT/inmem.txt"
    "$DELTAFIN" run --model "$CACHE/$m" --memory-budget off --prompt "$TEXT" --max-new 24 --stats \
      > /dev/null 2>> "$OUT/inmem.txt"
  done
done
for m in $MODELS; do
  "$DELTAFIN" bench run --model "$CACHE/$m" --memory-budget "$BUDGET" --prompt-tokens 16 --warmup-tokens 8 \
    --decode-tokens 24 --disk-gib-s "$DISK" --label "$m budget $BUDGET" --json >> "$OUT/ooc.jsonl" 2>> "$OUT/ooc.err"
done
uptime > "$OUT/uptime-end.txt"
grep -E "^==|^prefill" "$OUT/inmem.txt"
