import json, sys
O = sys.argv[1]
print("| routing | streams | aggregate tok/s | plan tok/s | disk MiB/tok | ideal MiB/tok | disk / ideal | union/layer | prev. reuse | of I/O bound |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in ["uniform", "published"]:
    try:
        plan = json.load(open(f"{O}/plan-{r}.json"))
    except Exception:
        continue
    pred = {x["streams"]: x["tokens_per_second"] for x in plan["predictions"] if x["kind"] == "decode"}
    levels = []
    for f in ["serve24", "serve8"]:
        try:
            levels += json.load(open(f"{O}/{f}-{r}.json"))["levels"]
        except Exception:
            pass
    for l in levels:
        s = l["streams"]
        mib = 1 << 20
        print(f"| {r} | {s} | {l['aggregate_tokens_per_second']:.2f} | {pred.get(s, float('nan')):.2f} | "
              f"{l['disk_bytes_per_token']/mib:.0f} | {l['ideal_disk_bytes_per_token']/mib:.0f} | {l['disk_over_ideal']:.2f} | "
              f"{l['union_experts_per_layer_step']:.1f} | {100*l['previous_pass_reuse']:.1f} % | {l['fraction_of_io_bound']:.2f} |")
