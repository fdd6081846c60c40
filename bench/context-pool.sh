#!/usr/bin/env bash
# context-pool.sh BIN [BUDGET] [CONTEXT]: the context-memory acceptance run of issue 35. Serves a
# 16-layer built-in-shaped model (MLA, 5 KiB of cache per position) with BIN under a cgroup v1
# memory limit equal to --memory-budget, drives bench/context_pool.py against it (8 concurrent
# 8k-token prompts, half sharing a 6k prefix, plus 200 short requests), and prints the server's
# plan line beside the cgroup's peak charge and OOM-kill count. Needs root (cgroup v1).
set -euo pipefail
bin=$(realpath "$1"); budget=${2:-400M}; context=${3:-192M}
here=$(cd "$(dirname "$0")" && pwd)
model=${DELTAFIN_CTX_MODEL:-/tmp/deltafin-ctx-model}
[ -f "$model/config.json" ] || "$bin" synth --preset builtin --layers 16 --max-position 16384 --out "$model" >/dev/null
limit=$(numfmt --from=iec "$budget")
port=$((20000 + RANDOM % 20000))
log=$(mktemp)
"$here/cgrun.sh" "$limit" ctxpool "$bin" serve --model "$model" --port "$port" --memory-budget "$budget" \
    --context-memory "$context" --max-batch 8 --context-limit 16384 --served-model-name m >"$log" 2>&1 &
runner=$!
for _ in $(seq 600); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    kill -0 $runner 2>/dev/null || break
    sleep 0.5
done
start=$(date +%s)
python3 "$here/context_pool.py" "http://127.0.0.1:$port" && rc=0 || rc=$?
echo "load took $(( $(date +%s) - start )) s"
curl -fs "http://127.0.0.1:$port/metrics" | grep -E "^deltafin_(engine_prefill_tokens|engine_steps|state_reuse|state_reuse_tokens|engine_step_seconds_sum)" || true
kill -TERM $(cat /sys/fs/cgroup/memory/deltafin-bench-ctxpool/cgroup.procs) 2>/dev/null || true
wait $runner || true
grep -E "^plan:|context memory" "$log" | head -3
grep -E "^cgroup ctxpool" "$log"
rm -f "$log"
exit $rc
