"""Time from a kill -9 to the next training step of a DDP job on pycoll that shrinks instead
of restarting: the pycoll side of ``benchmarks/elastic_restart_baseline.py`` (torchrun
``--max-restarts`` restarting a Gloo job), the same shape of job.

Each trial runs ``python -m pycoll.run --elastic -n N examples/elastic_ddp.py`` with rank
``--victim`` SIGKILLing itself in step ``--kill-step``; the victim prints the wall time of
its kill, every survivor the wall time at which its first step after the shrink completed.

    python benchmarks/experiments/elastic_ddp_recovery.py --trials 10 \\
        --out benchmarks/out/NAME
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_ddp.py"


def trial(n: int, victim: int, kill_step: int, steps: int, width: int) -> list[float]:
    proc = subprocess.run(
        [sys.executable, "-m", "pycoll.run", "--elastic", "-n", str(n), "--timeout", "300",
         str(EXAMPLE), "--steps", str(steps), "--kill-rank", str(victim), "--kill-step",
         str(kill_step), "--grow-every", "0", "--width", str(width)],
        cwd=str(ROOT), capture_output=True, text=True, timeout=320,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"job failed ({proc.returncode}): {proc.stderr[-2000:]}")
    kill = [float(t) for t in re.findall(r"SIGKILL at ([0-9.]+)", proc.stderr)]
    done = [float(t) for t in re.findall(r"first step after shrinking done at ([0-9.]+)",
                                         proc.stderr)]
    if len(kill) != 1 or len(done) != n - 1:
        raise RuntimeError(f"unexpected output: {proc.stderr[-2000:]}")
    return [t - kill[0] for t in done]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--victim", type=int, default=3)
    p.add_argument("--kill-step", type=int, default=35)
    p.add_argument("--steps", type=int, default=45)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--out", default="")
    args = p.parse_args()
    first, every = [], []
    for k in range(args.trials):
        times = trial(args.nproc, args.victim, args.kill_step, args.steps, args.width)
        first.append(min(times))
        every.append(max(times))
        print(f"trial {k}: kill -> next step {min(times):.3f} s (first rank), "
              f"{max(times):.3f} s (every rank)", flush=True)

    def q(v: list[float]) -> dict[str, float]:
        return {"p50": statistics.median(v), "p99": float(np.percentile(v, 99)),
                "min": min(v), "max": max(v)}

    result = {"command": "python " + " ".join(sys.argv), "nproc": args.nproc,
              "first_rank_s": q(first), "every_rank_s": q(every)}
    print(json.dumps(result, indent=1))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "pycoll-ddp-shrink.json").write_text(json.dumps(result, indent=1))
        rows = "\n".join(f"| the first step after the shrink, {name} | {v['p50']:.3f} | "
                         f"{v['p99']:.3f} | {v['min']:.3f} | {v['max']:.3f} |"
                         for name, v in (("first rank", result["first_rank_s"]),
                                         ("every rank", result["every_rank_s"])))
        (out / "pycoll-ddp-shrink.md").write_text(
            f"# pycoll: a DDP job shrinks after kill -9 of one rank\n\n`{result['command']}`\n\n"
            f"{args.nproc} ranks under `pycoll.run --elastic` (examples/elastic_ddp.py, MLP "
            f"width {args.width}), rank {args.victim} SIGKILLed in step {args.kill_step}; the "
            "survivors agree, shrink the default group, take rank 0's model and step and go "
            "on. Seconds from the kill to:\n\n| | p50 | p99 | min | max |\n|---|---|---|---|---|\n"
            f"{rows}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
