#!/usr/bin/env bash
# cgrun.sh LIMIT_BYTES NAME CMD...: run CMD inside a fresh cgroup v1 memory child limited to
# LIMIT_BYTES (page cache included), after dropping the page cache. Prints to stderr one line
# "cgroup NAME: max_usage=… failcnt=… oom_kill=… read_bytes=… rc=…" and exits with CMD's code.
set -u
limit=$1; name=$2; shift 2
cg=/sys/fs/cgroup/memory/deltafin-bench-$name
rmdir "$cg" 2>/dev/null
mkdir "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
sync; echo 3 > /proc/sys/vm/drop_caches
iofile=$(mktemp)
# The child moves itself into the group, then execs; /proc/PID/io is read by the parent loop.
sh -c 'echo $$ > '"$cg"'/cgroup.procs; exec "$@"' sh "$@" &
pid=$!
last=0
while kill -0 $pid 2>/dev/null; do
  v=$(awk '/^read_bytes/ {print $2}' /proc/$pid/io 2>/dev/null); [ -n "$v" ] && last=$v
  sleep 0.2
done
wait $pid; rc=$?
oom=$(awk '/^oom_kill / {print $2}' "$cg/memory.oom_control" 2>/dev/null)
echo "cgroup $name: limit=$limit max_usage=$(cat $cg/memory.max_usage_in_bytes) failcnt=$(cat $cg/memory.failcnt) oom_kill=${oom:-?} read_bytes=$last rc=$rc" >&2
rmdir "$cg" 2>/dev/null
rm -f "$iofile"
exit $rc
