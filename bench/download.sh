#!/usr/bin/env bash
# Download throughput of `deltafin setup --full` against a real HTTP server on loopback, and the
# cost of verification (docs/weights.md "Measurements"):
#
#   DELTAFIN=target/release/deltafin bench/download.sh
#
# 1. writes a synthetic DeepSeek-V3-architecture checkpoint of about 1.8 GB (`deltafin synth`);
# 2. lays it out as Hugging Face serves it (API JSON with LFS SHA-256s and git blob ids,
#    /resolve/<sha>/ paths) and serves it with nginx (Debian) on 127.0.0.1;
# 3. runs `deltafin setup --full --json` with 1, 2, 4 and 8 workers into fresh directories, and
#    `deltafin doctor --verify` on the result (hash time on its own);
# 4. beside it, the machine's own figures: curl of the largest file to /dev/null and to a file,
#    and dd write (fdatasync) / O_DIRECT read of the same size.
set -euo pipefail
cd "$(dirname "$0")/.."
DELTAFIN=${DELTAFIN:-target/release/deltafin}
WORK=${WORK:-/work/.bench-cache/download}
WORKERS=${WORKERS:-"1 2 4 8"}
mkdir -p "$WORK"
MODEL=$WORK/model
[ -f "$MODEL/config.json" ] || "$DELTAFIN" synth --out "$MODEL" --preset dsv3-bench --layers 4 --shards 2 >/dev/null
ROOT=$WORK/www
rm -rf "$ROOT" && mkdir -p "$ROOT"
python3 - "$MODEL" "$ROOT" <<'PYEOF'
import hashlib, json, os, shutil, sys
model, root = sys.argv[1], sys.argv[2]
files = sorted(f for f in os.listdir(model) if os.path.isfile(os.path.join(model, f)))
sha = hashlib.sha1("".join(files).encode()).hexdigest()
siblings = []
for f in files:
    data = open(os.path.join(model, f), "rb").read()
    if f.endswith(".safetensors"):
        siblings.append({"rfilename": f, "size": 135, "blobId": "0" * 40,
                         "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 135}})
    else:
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        siblings.append({"rfilename": f, "size": len(data), "blobId": blob})
    dst = os.path.join(root, "org/bench/resolve", sha, f)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.link(os.path.join(model, f), dst) if os.stat(model).st_dev == os.stat(root).st_dev else shutil.copy(os.path.join(model, f), dst)
api = os.path.join(root, "api/models/org/bench/revision")
os.makedirs(api, exist_ok=True)
for rev in ("main", sha):
    json.dump({"id": "org/bench", "sha": sha, "siblings": siblings}, open(os.path.join(api, rev), "w"))
PYEOF
PORT=${PORT:-18777}
CONF=$WORK/nginx
mkdir -p "$CONF/tmp"
cat > "$CONF/nginx.conf" <<NGX
worker_processes 2; user root root; pid $CONF/nginx.pid; error_log $CONF/error.log;
events { worker_connections 256; }
http { access_log off; sendfile on; default_type application/octet-stream;
  client_body_temp_path $CONF/tmp/b; proxy_temp_path $CONF/tmp/p; fastcgi_temp_path $CONF/tmp/f;
  uwsgi_temp_path $CONF/tmp/u; scgi_temp_path $CONF/tmp/s;
  server { listen 127.0.0.1:$PORT; root $ROOT; location /api/ { default_type application/json; } } }
NGX
nginx -p "$CONF" -c "$CONF/nginx.conf" -g "daemon off;" & NGINX=$!
trap 'kill $NGINX 2>/dev/null' EXIT
sleep 1
BIG=$(ls -S "$MODEL"/*.safetensors | head -1)
SIZE=$(stat -c %s "$BIG"); TOTAL=$(du -cb "$MODEL" | tail -1 | cut -f1)
echo "model: $TOTAL bytes in $(ls "$MODEL" | wc -l) files; largest $SIZE bytes"
cat "$MODEL"/* > /dev/null   # page cache hot on the server side, as a CDN edge would be
URL=http://127.0.0.1:$PORT/org/bench/resolve/$(ls "$ROOT/org/bench/resolve")/$(basename "$BIG")
for w in $WORKERS; do
    dir=$WORK/install-$w; rm -rf "$dir"
    start=$(date +%s.%N)
    "$DELTAFIN" setup --source hf://org/bench --endpoint "http://127.0.0.1:$PORT" --dir "$dir" --full --workers "$w" --json > "$WORK/setup-$w.json"
    end=$(date +%s.%N)
    python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); print(f'setup --workers {sys.argv[3]}: {t:.2f} s, {int(sys.argv[4])/t/1e6:.0f} MB/s (download + verify + publish)')" "$start" "$end" "$w" "$TOTAL"
done
start=$(date +%s.%N); "$DELTAFIN" doctor --dir "$WORK/install-1" --verify > /dev/null; end=$(date +%s.%N)
python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); print(f'doctor --verify (page cache warm): {t:.2f} s, {int(sys.argv[3])/t/1e6:.0f} MB/s')" "$start" "$end" "$TOTAL"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
start=$(date +%s.%N); "$DELTAFIN" doctor --dir "$WORK/install-1" --verify > /dev/null; end=$(date +%s.%N)
python3 -c "import sys; t=float(sys.argv[2])-float(sys.argv[1]); print(f'doctor --verify (after drop_caches): {t:.2f} s, {int(sys.argv[3])/t/1e6:.0f} MB/s')" "$start" "$end" "$TOTAL"
cat "$MODEL"/* > /dev/null
echo "beside it:"
curl -s -o /dev/null -w "  curl to /dev/null: %{speed_download} B/s\n" "$URL"
curl -s -o "$WORK/curl.out" -w "  curl to a file: %{speed_download} B/s\n" "$URL"; rm -f "$WORK/curl.out"
dd if=/dev/zero of="$WORK/dd.out" bs=1M count=$((SIZE >> 20)) conv=fdatasync 2>&1 | tail -1 | sed 's/^/  dd write+fdatasync: /'
dd if="$WORK/dd.out" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | sed 's/^/  dd O_DIRECT read: /'
rm -f "$WORK/dd.out"
rm -rf "$WORK"/install-*
