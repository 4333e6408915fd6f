#!/usr/bin/env python3
"""Summarize interleaved benchmarks/torch_backend.py runs of two trees (their --json files).

    python summarize_backend.py raw/backend-before-*.json -- raw/backend-after-*.json
"""
import json
import statistics
import sys

argv = sys.argv[1:]
cut = argv.index("--")
trees = {"before": [json.load(open(p)) for p in argv[:cut]],
         "after": [json.load(open(p)) for p in argv[cut + 1:]]}


def cell(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


print("| measure | before: median (min-max) of runs | after: median (min-max) of runs |")
print("|---|---|---|")
for what, get in (("DDP step pycoll (ms)", lambda r: r["ddp"]["pycoll"]["median_ms"]),
                  ("DDP step gloo (ms)", lambda r: r["ddp"]["gloo"]["median_ms"]),
                  ("DDP gloo/pycoll (x)", lambda r: r["ddp"]["gloo"]["median_ms"]
                   / r["ddp"]["pycoll"]["median_ms"])):
    print(f"| {what} | {cell([get(r) for r in trees['before']])} | "
          f"{cell([get(r) for r in trees['after']])} |")
rows = [(o["op"], o["MiB"]) for o in trees["after"][0]["ops"]]
for op, mib in rows:
    for key in ("torch_vs_direct", "torch_busbw_GBps", "direct_busbw_GBps"):
        vals = {t: [o[key] for r in runs for o in r["ops"] if (o["op"], o["MiB"]) == (op, mib)]
                for t, runs in trees.items()}
        print(f"| {op} {mib} MiB {key} | {cell(vals['before'])} | {cell(vals['after'])} |")
