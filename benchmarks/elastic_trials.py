"""Kill -9 trials of the elastic calls: how often a job survives, and how fast.

Each trial (``pycoll.testing.kill_trials``): n ranks on this host run a loop of mixed, checked
collectives; one rank SIGKILLs itself at a random moment ("loop"), or inside an agree
("agree"), or a second rank dies while the survivors shrink ("shrink"); every survivor
shrinks and runs checked collectives on the shrunk communicator. Reported per
configuration: trials passed / failed / hung, recovery (a survivor's error to its first
successful collective on the shrunk communicator) and detection (the SIGKILL to the
survivor's error) as p50 / p99 / max.

    python benchmarks/elastic_trials.py --trials 100 --ranks 4 8 --transports shm tcp \\
        --modes loop agree shrink --out benchmarks/out/elastic-recovery
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from pycoll.testing.kill_trials import run_trial

#: a trial whose detection or recovery takes longer is listed with its survivors' errors
SLOW_SECONDS = 5.0


def quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    p.add_argument("--transports", nargs="+", default=["shm", "tcp"])
    p.add_argument("--modes", nargs="+", default=["loop", "agree", "shrink"])
    p.add_argument("--seed", type=int, default=0, help="first trial's seed")
    p.add_argument("--out", default="", help="folder for results.json and results.md")
    args = p.parse_args()
    rows = []
    for n in args.ranks:
        for transport in args.transports:
            for mode in args.modes:
                passed, failures, recovery, detection, grow, slow = 0, [], [], [], [], []
                start = time.monotonic()
                for k in range(args.trials):
                    seed = args.seed + k
                    try:
                        result = run_trial(n, transport, mode, seed)
                    except Exception as e:  # noqa: BLE001 - a harness failure is a failure
                        failures.append({"seed": seed, "why": f"{type(e).__name__}: {e}"})
                        continue
                    if result.ok:
                        passed += 1
                        recovery += result.recovery_s
                        detection += result.detection_s or []
                        grow += result.grow_s or []
                        worst = max(result.recovery_s + (result.detection_s or []))
                        if worst > SLOW_SECONDS:     # what made it slow: the first errors
                            slow.append({"seed": seed, "worst_s": worst, "errors": [
                                s.get("first_error", "")[:300] for s in result.survivors]})
                            print(f"  SLOW n={n} {transport} {mode} seed {seed}: {worst:.1f} s",
                                  file=sys.stderr, flush=True)
                    else:
                        failures.append({"seed": seed, "why": result.why})
                        print(f"  FAILED n={n} {transport} {mode} seed {seed}: "
                              f"{result.why[:400]}", file=sys.stderr, flush=True)
                row = {"ranks": n, "transport": transport, "mode": mode,
                       "trials": args.trials, "passed": passed, "failures": failures,
                       "recovery_s": quantiles(recovery), "detection_s": quantiles(detection),
                       "grow_s": quantiles(grow), "slow": slow,
                       "wall_s": time.monotonic() - start}
                rows.append(row)
                r, d = row["recovery_s"], row["detection_s"]
                print(f"n={n} {transport:4s} {mode:7s} {passed}/{args.trials} passed; "
                      f"recovery p50 {fmt(r['p50'])} p99 {fmt(r['p99'])} max {fmt(r['max'])}; "
                      f"detection p50 {fmt(d['p50'])} p99 {fmt(d['p99'])}"
                      + (f"; grow p50 {fmt(row['grow_s']['p50'])} p99 "
                         f"{fmt(row['grow_s']['p99'])}" if grow else ""), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        command = "python " + " ".join(sys.argv)
        with open(os.path.join(args.out, "trials.json"), "w") as f:
            json.dump({"command": command, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "trials.md"), "w") as f:
            f.write(f"# Elastic kill -9 trials\n\n`{command}`\n\n"
                    "| ranks | transport | kill | passed | recovery p50 | p99 | max | "
                    "detection p50 | p99 | grow p50 | p99 |\n"
                    "|---|---|---|---|---|---|---|---|---|---|---|\n")
            for row in rows:
                r, d = row["recovery_s"], row["detection_s"]
                g = row["grow_s"]
                f.write(f"| {row['ranks']} | {row['transport']} | {row['mode']} | "
                        f"{row['passed']}/{row['trials']} | {fmt(r['p50'])} | {fmt(r['p99'])} "
                        f"| {fmt(r['max'])} | {fmt(d['p50'])} | {fmt(d['p99'])} "
                        f"| {fmt(g['p50'])} | {fmt(g['p99'])} |\n")
    return 0 if all(row["passed"] == row["trials"] for row in rows) else 1


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


if __name__ == "__main__":
    sys.exit(main())
