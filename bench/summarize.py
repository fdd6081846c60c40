#!/usr/bin/env python3
"""Summarise a bench/compare.sh results directory as a markdown table (ratios included)."""
import glob
import json
import os
import re
import sys

out, llama_n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
MIB = 1 << 20


def cg_lines(path):
    res = {}
    if os.path.exists(path):
        for line in open(path):
            m = re.match(r"cgroup (\S+): (.*)", line)
            if m:
                res[m.group(1)] = dict(kv.split("=") for kv in m.group(2).split())
    return res


disk = {k: json.load(open(os.path.join(out, f"disk-{k}.json"))) for k in ("before", "after") if os.path.exists(os.path.join(out, f"disk-{k}.json"))}
print("## Disk (deltafin bench disk: whole-expert random reads from the model's shards)\n")
print("| when | O_DIRECT best GiB/s | buffered best GiB/s | mmap best GiB/s |\n|---|---|---|---|")
for k, d in disk.items():
    print(f"| {k} | {d['best_direct_gib_s']:.2f} | {d['best_buffered_gib_s']:.2f} | {d['best_mmap_gib_s']:.2f} |")
if "before" in disk:
    print("\n| method | in flight | GiB/s |\n|---|---|---|")
    for p in disk["before"]["probes"]:
        print(f"| {p['method']} | {p['threads']} | {p['gib_per_second']:.2f} |")

ours = [json.loads(l) for l in open(os.path.join(out, "ours.jsonl"))] if os.path.exists(os.path.join(out, "ours.jsonl")) else []
cg = cg_lines(os.path.join(out, "ours.err"))
print("\n## deltafin (decode, uniform routing, 1 token per pass)\n")
print("| run | cache slots (fraction) | tok/s | I/O bound tok/s | **ratio** | I/O replay tok/s (ratio) | hit rate (no-read hits) | MiB/token read | ideal MiB/token | **read / ideal** | read GiB/s busy | compute / I-O wait s/token | look-ahead / prev recall | peak charged MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in ours:
    d, b, p = r["decode"], r.get("bound") or {}, r["stats"]["plan"]
    name = "ours-" + r["label"].split()[-1].replace("GiB", "") + "-" + r["label"].split()[1]
    peak = int(cg.get(name, {}).get("max_usage", 0)) / MIB
    rep = r.get("io_replay") or {}
    rep_s = f"{rep['tokens_per_second']:.2f} ({rep.get('ratio_to_io_bound') or float('nan'):.2f})" if rep else "-"
    print(f"| {r['label']} | {p['expert_slots']} ({100*p['cache_fraction']:.1f}%) | {d['tokens_per_second']:.3f} | "
          f"{b.get('io_bound_tokens_per_second', float('nan')):.2f} | **{b.get('ratio_to_io_bound', float('nan')):.2f}** | {rep_s} | "
          f"{100*d['hit_rate']:.1f}% ({100*d['cached_hit_rate']:.1f}%) | {d['read_bytes']/MIB:.0f} | "
          f"{b.get('ideal_bytes_per_token', 0)/MIB:.0f} | **{b.get('bytes_over_ideal', float('nan')):.2f}** | "
          f"{d['read_gib_per_second']:.2f} | {d['compute_seconds_per_token']:.3f} / {d['io_wait_seconds_per_token']:.3f} | "
          f"{100*d['lookahead_recall']:.0f}% / {100*d['previous_recall']:.0f}% | {peak:.0f} |")

lc = cg_lines(os.path.join(out, "llama.err"))
rows = []
for g in (8, 4, 2, 1, 16):
    a, b = lc.get(f"llama-{g}-2"), lc.get(f"llama-{g}-{2 + llama_n}")
    f = os.path.join(out, f"llama-{g}-{2 + llama_n}.json")
    if not (a and b and os.path.exists(f)):
        continue
    try:
        ts = json.load(open(f))[0]["avg_ts"]
    except Exception:
        ts = float("nan")
    per_tok = (int(b["read_bytes"]) - int(a["read_bytes"])) / llama_n
    rows.append((g, ts, per_tok, int(b["max_usage"]) / MIB, b["rc"]))
if rows:
    print("\n## llama.cpp (llama-bench, BF16 GGUF of the same weights, default mmap, same cgroup limits)\n")
    print("| limit GiB | tok/s | MiB/token read (from /proc/PID/io, 2 run lengths) | peak charged MiB | rc |\n|---|---|---|---|---|")
    for g, ts, per_tok, peak, rc in rows:
        print(f"| {g} | {ts:.3f} | {per_tok/MIB:.0f} | {peak:.0f} | {rc} |")


def llama_ts(path):
    try:
        return json.load(open(path))[0]["avg_ts"]
    except Exception:
        return float("nan")


inm_path = os.path.join(out, "inmem-ours.jsonl")
inm = [json.loads(l) for l in open(inm_path)] if os.path.exists(inm_path) else []
inm_llama = [llama_ts(f) for f in sorted(glob.glob(os.path.join(out, "inmem-llama-*.json")))]
if inm or inm_llama:
    print("\n## In memory (no limit, weights warm; runs interleaved)\n")
    print("| repeat | deltafin tok/s | hit rate | compute s/token | llama.cpp tok/s | **deltafin / llama.cpp** |")
    print("|---|---|---|---|---|---|")
    for i in range(max(len(inm), len(inm_llama))):
        d = inm[i]["decode"] if i < len(inm) else None
        lt = inm_llama[i] if i < len(inm_llama) else float("nan")
        ours_ts = d["tokens_per_second"] if d else float("nan")
        print(f"| {i + 1} | {ours_ts:.2f} | {100 * d['hit_rate']:.1f}% | {d['compute_seconds_per_token']:.3f} | "
              f"{lt:.2f} | **{ours_ts / lt:.2f}x** |" if d else f"| {i + 1} | - | - | - | {lt:.2f} | - |")

if ours and rows:
    print("\n## Under each limit: deltafin / llama.cpp\n")
    print("| limit GiB | arm | deltafin tok/s | llama.cpp tok/s | **deltafin / llama.cpp** | deltafin / I/O bound | read / ideal |")
    print("|---|---|---|---|---|---|---|")
    llama_by = {g: ts for g, ts, *_ in rows}
    for r in ours:
        g = int(r["label"].split()[-1].replace("GiB", ""))
        if g not in llama_by:
            continue
        b = r.get("bound") or {}
        ts = r["decode"]["tokens_per_second"]
        print(f"| {g} | {r['label'].split()[1]} | {ts:.3f} | {llama_by[g]:.3f} | **{ts / llama_by[g]:.1f}x** | "
              f"{b.get('ratio_to_io_bound', float('nan')):.2f} | {b.get('bytes_over_ideal', float('nan')):.2f} |")
