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
# Not part of scripts/test-all: a cold build compiles the whole server in release mode inside
# the container (about 6-10 minutes on 2 cores with RELEASE_LTO=off; the debootstrap base adds
# about 30 s once). Needs root, buildah, podman, runc and debootstrap (apt-get install buildah podman
# runc debootstrap).
#
# Usage: images/test-image.sh [SOURCE_DIR]   (default: this checkout; any workspace checkout with
#        the same layout works, e.g. one whose server has `serve`)
# Environment: IMAGE (default localhost/deltafin:test), RELEASE_LTO (default off), CODEGEN_UNITS (16),
#        OPERATOR_IMAGE=1 also builds images/operator.Containerfile and runs `deltafin-operator crd`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "${1:-$HERE/..}" && pwd)
IMAGE=${IMAGE:-localhost/deltafin:test}
BASE=localhost/debian:bookworm-min
BUILDER=localhost/deltafin-rust:local
RELEASE_LTO=${RELEASE_LTO:-off}
CODEGEN_UNITS=${CODEGEN_UNITS:-16}
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

step "buildah bud images/server-cpu.Containerfile ($SRC, RELEASE_LTO=$RELEASE_LTO) -> $IMAGE"
buildah "${SD[@]}" bud --isolation chroot --layers=false \
    -f "$HERE/server-cpu.Containerfile" \
    --build-arg RUST_IMAGE="$BUILDER" --build-arg RUNTIME_IMAGE="$BASE" --build-arg CARGO_PROFILE_RELEASE_LTO="$RELEASE_LTO" --build-arg CARGO_PROFILE_RELEASE_CODEGEN_UNITS="$CODEGEN_UNITS" \
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
resp=$(curl -s http://127.0.0.1:18000/v1/chat/completions -H 'content-type: application/json' \
    -d "{\"model\":\"$model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8}")
echo "$resp" | head -c 600; echo
echo "$resp" | python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["choices"][0]["message"]["role"]=="assistant"'
step "chat completion OK"

if [ "${OPERATOR_IMAGE:-0}" = 1 ]; then
    step "buildah bud images/operator.Containerfile"
    buildah "${SD[@]}" bud --isolation chroot --layers=false -f "$HERE/operator.Containerfile" \
        --build-arg RUST_IMAGE="$BUILDER" --build-arg RUNTIME_IMAGE="$BASE" --build-arg CARGO_PROFILE_RELEASE_LTO="$RELEASE_LTO" --build-arg CARGO_PROFILE_RELEASE_CODEGEN_UNITS="$CODEGEN_UNITS" \
        -v "$TOOLCHAIN:/opt/rust:ro" -v "$REGISTRY:/usr/local/cargo/registry" \
        -t localhost/deltafin-operator:test "$SRC" 2>&1 | tail -n 3
    "${PODMAN[@]}" run "${RUN_OPTS[@]}" --network none localhost/deltafin-operator:test crd | head -n 5
fi
step "image checks passed"
