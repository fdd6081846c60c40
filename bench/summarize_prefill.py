#!/usr/bin/env python3
"""Summarise a bench/prefill.sh results directory as markdown: prefill tok/s of deltafin and
llama.cpp at each prompt length, in memory and under the cgroup limit, with the ratios (to
llama.cpp, and under the limit to the prefill I/O bound)."""
import json
import os
import re
import sys

out, limit = sys.argv[1], sys.argv[2]


def load(name):
    path = os.path.join(out, name)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path) as f:
        return json.load(f)


def llama_points(doc):
    """{prompt tokens: tok/s} from llama-bench's JSON (one object per test)."""
    if not doc:
        return {}
    return {r["n_prompt"]: r["avg_ts"] for r in doc if r.get("n_gen", 0) == 0 and r.get("n_prompt")}


def fmt(v, pattern):
    return "—" if v is None or v is False else pattern.format(v)


def cgroup_lines():
    res = {}
    for err in ("ours.err", "llama.err"):
        path = os.path.join(out, err)
        if os.path.exists(path):
            for line in open(path):
                m = re.match(r"cgroup (\S+): (.*)", line)
                if m:
                    res[m.group(1)] = dict(kv.split("=", 1) for kv in m.group(2).split())
    return res


disk = load("disk.json")
cpu = open(os.path.join(out, "cpu.txt")).read().strip() if os.path.exists(os.path.join(out, "cpu.txt")) else "?"
print(f"CPU: {cpu}")
if disk:
    print(f"Disk: O_DIRECT {disk['best_direct_gib_s']:.2f} GiB/s, buffered {disk['best_buffered_gib_s']:.2f} GiB/s")
for f in ("uptime-start.txt", "uptime-end.txt"):
    if os.path.exists(os.path.join(out, f)):
        print(f"{f[:-4]}: {open(os.path.join(out, f)).read().strip()}")
print()

for arm, ours_file, llama_file, title in (
    ("memory", "ours-memory.json", "llama-memory.json", "In memory (page cache warm, no limit)"),
    ("limit", "ours-limit.json", "llama-limit.json", f"Under a {limit} GiB cgroup v1 limit (page cache dropped)"),
):
    ours, llama = load(ours_file), llama_points(load(llama_file))
    print(f"## {title}\n")
    print("| prompt tokens | deltafin tok/s | llama.cpp tok/s | deltafin / llama.cpp | expert GiB read | I/O bound s | measured / bound |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for p in (ours or {}).get("points", []):
        n, tps = p["tokens"], p["tokens_per_second"]
        peer = llama.get(n)
        read, bound, rb = p.get("expert_read_bytes"), p.get("io_bound_seconds"), p.get("ratio_to_io_bound")
        cells = [
            str(n),
            f"{tps:.1f}",
            fmt(peer, "{:.1f}"),
            fmt(peer and tps / peer, "{:.2f}x"),
            fmt(read is not None and read / (1 << 30), "{:.2f}"),
            fmt(bound, "{:.2f}"),
            fmt(rb, "{:.2f}"),
        ]
        print("| " + " | ".join(cells) + " |")
    print()

cg = cgroup_lines()
if cg:
    print("## cgroup figures\n\n| run | max_usage GiB | failcnt | oom_kill | read GiB | rc |\n|---|---:|---:|---:|---:|---:|")
    for name, d in cg.items():
        print(f"| {name} | {int(d.get('max_usage', 0)) / (1 << 30):.2f} | {d.get('failcnt')} | {d.get('oom_kill')} | "
              f"{int(d.get('read_bytes', 0)) / (1 << 30):.2f} | {d.get('rc')} |")
