#!/usr/bin/env bash
# Builds the CPU server image with buildah and checks it with podman, offline-friendly:
#   * the public bases (rust, distroless) are replaced by local ones: a Debian bookworm minbase
#     made with debootstrap (runtime), and the same plus gcc for the build stage, with the host's
#     Rust toolchain and cargo registry bind-mounted into the build (no rustup download);
#   * the image runs read-only as uid 65532 with /cache and /tmp as the only writable paths;
#   * checks, in order: `deltafin --version`, `deltafin run --prompt hi --json` (built-in model),
#     then `deltafin serve` answering /livez, /readyz and one chat completion. A binary without
#     a `serve` subcommand stops after the `run` check and says so (exit 3).
#
# scripts/test-all runs `--all`. A cold build compiles the server in release mode inside the
# container (about 6-10 minutes on 2 cores with RELEASE_LTO=off; the debootstrap base adds about
# 30 s once); the three builds share one cargo target cache (id deltafin-target), so the operator
# and the CUDA stage then compile little beyond their own crates. Needs root, buildah, podman,
# runc and debootstrap (scripts/install-test-deps installs them).
#
# Usage: images/test-image.sh [SOURCE_DIR]            server image (default SOURCE_DIR: this
#        checkout; any workspace checkout with the same layout works)
#        images/test-image.sh --operator [SOURCE_DIR] operator image instead: build, then run
#        `deltafin-operator --version` and `crd` read-only as uid 65532
#        images/test-image.sh --cuda-build-stage [SOURCE_DIR]  the Rust stage of
#        images/server-cuda.Containerfile (`--features cuda`) on the local builder; no GPU run
#        images/test-image.sh --all [SOURCE_DIR]     all three, in that order (server, operator, CUDA stage)
# Environment: IMAGE (default localhost/deltafin:test), RELEASE_LTO (default off), CODEGEN_UNITS (16),
# OPT_LEVEL (0; releases keep the workspace profile: fat LTO, one codegen unit, opt-level 3).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
MODE=server
case "${1:-}" in
    --operator) MODE=operator; shift ;;
    --cuda-build-stage) MODE=cuda; shift ;;
    --all) MODE=all; shift ;;
esac
SRC=$(cd "${1:-$HERE/..}" && pwd)
IMAGE=${IMAGE:-localhost/deltafin:test}
BASE=localhost/debian:bookworm-min
BUILDER=localhost/deltafin-rust:local
RELEASE_LTO=${RELEASE_LTO:-off}
CODEGEN_UNITS=${CODEGEN_UNITS:-16}
OPT_LEVEL=${OPT_LEVEL:-0}   # test builds: the images' behaviour, not their speed, is under test
TOOLCHAIN=$(rustc --print sysroot)
REGISTRY=${CARGO_HOME:-$HOME/.cargo}/registry
SD=(--storage-driver vfs)
PODMAN=(podman "${SD[@]}" --cgroup-manager cgroupfs --runtime runc)
RUN_OPTS=(--rm --read-only --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)   # /cache, /weights: anonymous volumes from the image (uid 65532)
start=$(date +%s)
step() { echo "== [$(( $(date +%s) - start ))s] $*"; }

for t in buildah podman debootstrap runc; do
    command -v "$t" >/dev/null || { echo "missing $t: apt-get install buildah podman runc debootstrap" >&2; exit 1; }
done

# Local stand-in for the public Debian/distroless bases.
if ! "${PODMAN[@]}" image exists "$BASE"; then
    step "debootstrap bookworm minbase -> $BASE"
    root=$(mktemp -d)
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
    chmod 0755 "$root"   # mktemp made it 0700, and tar records / with that mode
    tar -C "$root" -c . | "${PODMAN[@]}" import - "$BASE" >/dev/null
    rm -rf "$root"
fi
# Build stage stand-in for docker.io/library/rust: the base plus a C linker; rustc/cargo come
# from the host toolchain mounted at /opt/rust during the build.
if ! "${PODMAN[@]}" image exists "$BUILDER"; then
    step "builder image $BUILDER"
    ctx=$(mktemp -d)
    cat >"$ctx/Containerfile" <<EOF
FROM $BASE
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev ca-certificates && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/rust/bin:/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_HOME=/usr/local/cargo
EOF
    buildah "${SD[@]}" bud --isolation chroot -q -t "$BUILDER" "$ctx" >/dev/null
    rm -rf "$ctx"
fi

operator_image() {
    step "buildah bud images/operator.Containerfile ($SRC) -> localhost/deltafin-operator:test"
    buildah "${SD[@]}" bud --isolation chroot --layers=false -f "$HERE/operator.Containerfile" \
        --build-arg RUST_IMAGE="$BUILDER" --build-arg RUNTIME_IMAGE="$BASE" \
        --build-arg CARGO_PROFILE_RELEASE_LTO="$RELEASE_LTO" --build-arg CARGO_PROFILE_RELEASE_CODEGEN_UNITS="$CODEGEN_UNITS" --build-arg CARGO_PROFILE_RELEASE_OPT_LEVEL="$OPT_LEVEL" \
        -v "$TOOLCHAIN:/opt/rust:ro" -v "$REGISTRY:/usr/local/cargo/registry" \
        -t localhost/deltafin-operator:test "$SRC" 2>&1 | grep -vE '^\s*(Compiling|Downloaded|Downloading) ' | tail -n 20
    step "image: $("${PODMAN[@]}" image inspect localhost/deltafin-operator:test --format '{{.Config.User}} {{.Config.Entrypoint}} {{.Config.Cmd}} {{.Size}} bytes')"
    "${PODMAN[@]}" run "${RUN_OPTS[@]}" --network none localhost/deltafin-operator:test --version
    "${PODMAN[@]}" run "${RUN_OPTS[@]}" --network none localhost/deltafin-operator:test crd | diff -q - "$HERE/../charts/deltafin/files/crd.yaml"
    step "operator image checks passed (crd output equals charts/deltafin/files/crd.yaml)"
}

# The CUDA image's Rust stage (`--target build`): the CUDA devel base cannot be pulled here, so
# the local builder stands in for it; the feature builds without a CUDA toolkit.
cuda_build_stage() {
    step "buildah bud --target build images/server-cuda.Containerfile ($SRC) -> localhost/deltafin-cuda-build:test"
    buildah "${SD[@]}" bud --isolation chroot --layers=false --target build -f "$HERE/server-cuda.Containerfile" \
        --build-arg BUILD_IMAGE="$BUILDER" \
        --build-arg CARGO_PROFILE_RELEASE_LTO="$RELEASE_LTO" --build-arg CARGO_PROFILE_RELEASE_CODEGEN_UNITS="$CODEGEN_UNITS" --build-arg CARGO_PROFILE_RELEASE_OPT_LEVEL="$OPT_LEVEL" \
        -v "$TOOLCHAIN:/opt/rust:ro" -v "$REGISTRY:/usr/local/cargo/registry" \
        -t localhost/deltafin-cuda-build:test "$SRC" 2>&1 | grep -vE '^\s*(Compiling|Downloaded|Downloading) ' | tail -n 20
    "${PODMAN[@]}" run "${RUN_OPTS[@]}" --network none --entrypoint /out/deltafin localhost/deltafin-cuda-build:test --version
    "${PODMAN[@]}" rmi localhost/deltafin-cuda-build:test >/dev/null
    step "CUDA image Rust stage built (--features cuda)"
}

case "$MODE" in
    operator) operator_image; exit 0 ;;
    cuda) cuda_build_stage; exit 0 ;;
esac

step "buildah bud images/server-cpu.Containerfile ($SRC, RELEASE_LTO=$RELEASE_LTO) -> $IMAGE"
buildah "${SD[@]}" bud --isolation chroot --layers=false \
    -f "$HERE/server-cpu.Containerfile" \
    --build-arg RUST_IMAGE="$BUILDER" --build-arg RUNTIME_IMAGE="$BASE" --build-arg CARGO_PROFILE_RELEASE_LTO="$RELEASE_LTO" --build-arg CARGO_PROFILE_RELEASE_CODEGEN_UNITS="$CODEGEN_UNITS" --build-arg CARGO_PROFILE_RELEASE_OPT_LEVEL="$OPT_LEVEL" \
    -v "$TOOLCHAIN:/opt/rust:ro" -v "$REGISTRY:/usr/local/cargo/registry" \
    -t "$IMAGE" "$SRC" 2>&1 | grep -vE '^\s*(Compiling|Downloaded|Downloading) ' | tail -n 40
step "image: $("${PODMAN[@]}" image inspect "$IMAGE" --format '{{.Config.User}} {{.Config.Entrypoint}} {{.Config.Cmd}} {{.Size}} bytes')"

step "podman run (read-only, uid 65532): deltafin --version"
"${PODMAN[@]}" run "${RUN_OPTS[@]}" --network none "$IMAGE" --version

step "podman run: deltafin run --prompt hi --json (built-in default model)"
out=$("${PODMAN[@]}" run "${RUN_OPTS[@]}" --network none "$IMAGE" run --prompt hi --json)
echo "$out" | head -c 600; echo
echo "$out" | python3 -c 'import json,sys; json.loads(sys.stdin.read())' || { echo "run --json printed no JSON" >&2; exit 1; }

if ! "${PODMAN[@]}" run "${RUN_OPTS[@]}" --network none "$IMAGE" serve --help >/dev/null 2>&1; then
    step "STOP: this deltafin has no 'serve' subcommand yet; image build and 'run' verified"
    exit 3
fi

step "podman run: deltafin serve (default CMD args, port 18000 on the host network)"
name=deltafin-image-test-$$
"${PODMAN[@]}" run -d "${RUN_OPTS[@]}" --name "$name" --network host "$IMAGE" serve --host 127.0.0.1 --port 18000 >/dev/null
trap '"${PODMAN[@]}" rm -f "$name" >/dev/null 2>&1 || true' EXIT
code=000
for _ in $(seq 1 120); do
    code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18000/readyz || true)
    [ "$code" = 200 ] && break
    sleep 1
done
curl -sf http://127.0.0.1:18000/livez >/dev/null || { "${PODMAN[@]}" logs "$name" | tail; echo "/livez failed" >&2; exit 1; }
[ "$code" = 200 ] || { "${PODMAN[@]}" logs "$name" | tail; echo "/readyz never 200 (last $code)" >&2; exit 1; }
step "/livez 200, /readyz 200"
model=$(curl -sf http://127.0.0.1:18000/v1/models | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
step "/v1/models: $model"
PY=${DELTAFIN_TEST_PYTHON:-python3}
"$PY" - "$model" <<'PYEOF'
import sys
import openai
c = openai.OpenAI(base_url="http://127.0.0.1:18000/v1", api_key="unused", max_retries=0, timeout=120)
r = c.chat.completions.create(model=sys.argv[1], messages=[{"role": "user", "content": "Once upon a time"}], max_tokens=16)
assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens > 0, r
print("chat:", repr(r.choices[0].message.content))
PYEOF
step "chat completion OK (official openai client)"
metrics=$(curl -sf http://127.0.0.1:18000/metrics)
grep -q '^deltafin_requests_total{endpoint="chat_completions",outcome="success"} 1$' <<<"$metrics" \
    || { echo "/metrics does not count the chat completion" >&2; exit 1; }
step "/metrics counts it"

step "server image checks passed"
if [ "$MODE" = all ]; then
    "${PODMAN[@]}" rm -f "$name" >/dev/null 2>&1 || true
    operator_image
    cuda_build_stage
    step "all image checks passed"
fi
