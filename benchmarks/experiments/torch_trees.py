#!/usr/bin/env python3
"""One torch-layer benchmark on two source trees, interleaved: before/after in the same run.

    git worktree add --detach /tmp/before <commit>
    python benchmarks/experiments/torch_trees.py /tmp/before . --reps 7 --out DIR \\
        -- benchmarks/experiments/torch_overhead.py --mib 1

Runs ``python -m pycoll.run -n 2 <benchmark> <args>`` with ``PYTHONPATH`` on each tree in
turn (the benchmark file is the after tree's, so both run the same measurement), alternating
which tree goes first every repetition so that this shared machine's noise hits both alike.
Every line of rank 0's output of the form ``  <label>  <number> <number> ...`` is a row; the
table gives, per row and column, the median over repetitions with the min-max spread, for
both trees. Raw outputs go to ``DIR/<name>-<tree>-<rep>.txt``.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^  (\S.*?)\s{2,}(-?\d+\.\d+(?:\s+-?\d+\.\d+)*)\s*$")


def run(tree: str, bench: list[str], ranks: int) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    env["PYTHONPATH"] = os.path.abspath(tree)
    cmd = [sys.executable, "-m", "pycoll.run", "-n", str(ranks), *bench]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True,
                          timeout=1800)
    return done.stdout


def rows(text: str) -> dict[str, list[float]]:
    out = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            out[m.group(1)] = [float(x) for x in m.group(2).split()]
    return out


def column_names(text: str) -> list[str]:
    """The names of the columns: the words after the first of the indented line just
    before the first row (the benchmark's table header), if there is one."""
    last = ""
    for line in text.splitlines():
        if ROW.match(line):
            return last.split()[1:]
        if line.startswith("  "):
            last = line
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="run", help="prefix of the raw output files")
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("give the benchmark after --")
    cut = argv.index("--")
    args = ap.parse_args(argv[:cut])
    bench = argv[cut + 1:]
    bench[0] = os.path.abspath(bench[0])
    os.makedirs(args.out, exist_ok=True)
    trees = {"before": args.before, "after": args.after}
    got: dict[str, dict[str, list[list[float]]]] = {"before": {}, "after": {}}
    header, names = "", []
    for rep in range(args.reps):
        for label in (["before", "after"] if rep % 2 == 0 else ["after", "before"]):
            text = run(trees[label], bench, args.ranks)
            with open(os.path.join(args.out, f"{args.name}-{label}-{rep}.txt"), "w") as f:
                f.write(text)
            header = header or text.splitlines()[0]
            names = names or column_names(text)
            for row, values in rows(text).items():
                got[label].setdefault(row, []).append(values)
    print(f"{' '.join(bench[1:]) or bench[0]}: {args.reps} runs per tree, interleaved")
    print(header)
    print("| row | col | before: median (min-max) | after: median (min-max) | after/before |")
    print("|---|---|---|---|---|")
    for row, runs in got["after"].items():
        for col in range(len(runs[0])):
            a = [r[col] for r in runs if len(r) > col]
            b = [r[col] for r in got["before"].get(row, []) if len(r) > col]
            ma = statistics.median(a)
            if b:
                mb = statistics.median(b)
                ratio = f"{ma / mb:.2f}" if mb else "-"
                bs = f"{mb:.2f} ({min(b):.2f}-{max(b):.2f})"
            else:
                ratio, bs = "-", "-"
            name = names[col] if col < len(names) else str(col)
            print(f"| {row} | {name} | {bs} | {ma:.2f} ({min(a):.2f}-{max(a):.2f}) | {ratio} |")


if __name__ == "__main__":
    main()
