#!/usr/bin/env python3
"""pycoll against an earlier pycoll: the same benchmark on two source trees, interleaved.

    git worktree add /tmp/before <commit>
    python benchmarks/before_after.py /tmp/before . --out benchmarks/out/<date>-<label>

or one tree in two settings (``--env-after``: variables of the second variant, ``--labels``):

    python benchmarks/before_after.py . . --env-after PYCOLL_DETERMINISTIC=1 \
        --labels default,deterministic --out benchmarks/out/<date>-deterministic

Runs ``python -m pycoll.bench`` for allreduce and broadcast at 2 and 4 ranks on each tree
(``PYTHONPATH`` picks the tree), alternating which tree goes first every repetition so that
the machine's noise hits both alike, and writes a markdown table of the median average
latency per size with the min-max spread of the repetitions, plus the raw rows. A size is
"within noise" when the two spreads overlap.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def run(tree: str, coll: str, ranks: int, sizes: str, budget: float, path: str,
        extra: dict[str, str]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env["PYTHONPATH"] = os.path.abspath(tree)
    env.update(extra)
    cmd = [sys.executable, "-m", "pycoll.bench", coll, "-n", str(ranks), "-m", sizes, "-q",
           "--time-budget", str(budget), "--json", path]
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, timeout=1800)
    with open(path) as f:
        return json.load(f)["results"]


def table(rows: dict[tuple, dict[str, list[float]]], labels: tuple[str, str]) -> str:
    first, second = labels
    out = [f"| collective | ranks | size (B) | {first}: median avg us (min-max) | "
           f"{second}: median avg us (min-max) | {second}/{first} | spreads overlap |",
           "|---|---|---|---|---|---|---|"]
    for (coll, ranks, size), d in sorted(rows.items()):
        b, a = d["before"], d["after"]
        mb, ma = statistics.median(b), statistics.median(a)
        overlap = not (min(a) > max(b) or max(a) < min(b))
        out.append(f"| {coll} | {ranks} | {size} | {mb:.1f} ({min(b):.1f}-{max(b):.1f}) | "
                   f"{ma:.1f} ({min(a):.1f}-{max(a):.1f}) | {ma / mb:.2f} | "
                   f"{'yes' if overlap else 'no'} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out", required=True, help="results folder")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="8:64M")
    ap.add_argument("--time-budget", type=float, default=0.3)
    ap.add_argument("--collectives", default="allreduce,broadcast")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--env-before", action="append", default=[], metavar="NAME=VALUE",
                    help="a variable of the first variant's runs (repeatable)")
    ap.add_argument("--env-after", action="append", default=[], metavar="NAME=VALUE",
                    help="a variable of the second variant's runs (repeatable)")
    ap.add_argument("--labels", default="before,after", help="the two variants' names")
    args = ap.parse_args()
    envs = {"before": dict(v.split("=", 1) for v in args.env_before),
            "after": dict(v.split("=", 1) for v in args.env_after)}
    labels = tuple(args.labels.split(",", 1))
    os.makedirs(args.out, exist_ok=True)
    cases = [(c, int(n)) for c in args.collectives.split(",") for n in args.ranks.split(",")]
    rows: dict[tuple, dict[str, list[float]]] = {}
    raw = []
    for rep in range(args.reps):
        for coll, ranks in cases:
            order = [("before", args.before), ("after", args.after)]
            if rep % 2:
                order.reverse()
            for label, tree in order:
                start = time.time()
                path = os.path.join(args.out, f".{label}.json")
                for row in run(tree, coll, ranks, args.sizes, args.time_budget, path,
                               envs[label]):
                    rows.setdefault((coll, ranks, row["size"]), {"before": [], "after": []})[
                        label].append(row["avg_us"])
                    raw.append(dict(row, tree=label, rep=rep))
                os.unlink(path)
                print(f"rep {rep} {label} {coll} n={ranks}: {time.time() - start:.1f} s",
                      flush=True)
    with open(os.path.join(args.out, "raw.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in raw)
    with open(os.path.join(args.out, "before-after.md"), "w") as f:
        f.write(f"# {labels[0]} ({args.before} {envs['before'] or ''}) vs {labels[1]} "
                f"({args.after} {envs['after'] or ''})\n\n"
                f"{args.reps} interleaved repetitions, `python -m pycoll.bench <collective> -n "
                f"<ranks> -m {args.sizes} --time-budget {args.time_budget}`; average latency per "
                "iteration (OSU timing).\n\n" + table(rows, labels) + "\n")
    print(table(rows, labels))


if __name__ == "__main__":
    main()
