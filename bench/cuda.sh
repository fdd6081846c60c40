#!/usr/bin/env bash
# The CUDA backend on a machine with an NVIDIA GPU (docs/cuda.md), in two halves because GPU
# machines here have no network (no crates.io) and no Rust toolchain is assumed there:
#
#   bench/cuda.sh build   # here: builds the CUDA test binary and a release deltafin with
#                         # `--features cuda` into .device/ (git-ignored, ~40 MB)
#   bench/cuda.sh run     # there (with .device/ carried along): device parity tests with
#                         # DELTAFIN_REQUIRE_CUDA=1 (served requests included), the CPU-vs-GPU
#                         # token check on the built-in model, `deltafin bench serve` on both
#                         # devices (and on the GPU under --device-memory 4G), and
#                         # `deltafin bench kernels` on both devices (on the GPU with the upload
#                         # figures: pageable vs pinned-staging GB/s and the overlap of expert
#                         # uploads with products); results in $OUT
#
# The binaries load libcuda and libnvrtc at run time (the driver and the CUDA runtime's NVRTC
# must be installed, or libnvrtc.so.12 on LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=.device
case "${1:-}" in
build)
    mkdir -p "$DEV"
    cargo build --release --locked -p deltafin --features cuda
    install -m 0755 target/release/deltafin "$DEV/deltafin"
    bin=$(cargo test --locked -p deltafin-engine --features cuda --test cuda --no-run --message-format=json \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda" and m.get("executable"):
        print(m["executable"])')
    install -m 0755 "$bin" "$DEV/cuda-tests"
    ls -la "$DEV"
    ;;
run)
    OUT=${OUT:-bench/results/cuda-$(date -u +%Y%m%dT%H%M%SZ)}
    mkdir -p "$OUT"
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    export DELTAFIN_CACHE_DIR=${DELTAFIN_CACHE_DIR:-$(mktemp -d)}
    echo "== device parity tests" | tee "$OUT/tests.txt"
    DELTAFIN_REQUIRE_CUDA=1 "$DEV/cuda-tests" --test-threads 1 --nocapture 2>&1 | tee -a "$OUT/tests.txt"
    echo "== the built-in model: same tokens on cpu and cuda" | tee "$OUT/run.txt"
    for d in cpu cuda; do
        "$DEV/deltafin" --device "$d" run --prompt "Count the primes below 50" --max-new 32 --json \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"])' > "$OUT/ids-$d.txt"
    done
    cmp "$OUT/ids-cpu.txt" "$OUT/ids-cuda.txt" && echo "identical: $(cat "$OUT/ids-cpu.txt")" | tee -a "$OUT/run.txt"
    echo "== served on the device: the engine loop over whole device passes (arch::DeviceModel)" | tee "$OUT/serve.txt"
    for d in cpu cuda; do
        "$DEV/deltafin" --device "$d" bench serve --streams 1,4,8 --tokens 32 2>&1 | tee -a "$OUT/serve.txt"
    done
    for mem in "" "--device-memory 4G"; do
        echo "== decode on cuda ${mem:-resident}" | tee -a "$OUT/serve.txt"
        "$DEV/deltafin" --device cuda $mem bench serve --streams 1 --tokens 32 2>&1 | tee -a "$OUT/serve.txt"
    done
    echo "== kernels" | tee "$OUT/kernels.txt"
    "$DEV/deltafin" bench kernels | tee -a "$OUT/kernels.txt"
    "$DEV/deltafin" --device cuda bench kernels | tee -a "$OUT/kernels.txt"
    ;;
*)
    echo "usage: bench/cuda.sh build|run" >&2
    exit 2
    ;;
esac
