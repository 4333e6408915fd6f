#!/usr/bin/env python3
"""DDP step time with ``torch.use_deterministic_algorithms(True)`` against without, on the
"pycoll" backend (which then folds every gradient allreduce in rank order).

    python -m pycoll.run -n 2 benchmarks/experiments/ddp_deterministic.py [--rounds 6] [--steps 10]

examples/ddp_train.py's model, trained from the same seed in alternating rounds (on, off,
off, on, ...) so that the machine's noise hits both alike; rank 0 prints the median step
time of each, the ratio, and whether two deterministic rounds ended with the same parameter
checksum (they must: same data, same order of every sum). ``--backend gloo`` measures the
same flag on Gloo, whose collectives ignore it: what torch's own deterministic kernels
cost, apart from pycoll's.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401  (registers the backend)

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--backend", default="pycoll", help="pycoll (default) or gloo")
    ap.add_argument("--json", help="write the results here (rank 0)")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("ddp_train", ROOT / "examples" / "ddp_train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # type: ignore[union-attr]
    dist.init_process_group(backend=args.backend)
    times: dict[str, list[float]] = {"off": [], "on": []}
    sums: dict[str, list[float]] = {"off": [], "on": []}
    for rnd in range(args.rounds):
        order = ["on", "off"] if rnd % 2 == 0 else ["off", "on"]
        for mode in order:
            torch.use_deterministic_algorithms(mode == "on")
            t, checksum = example.train(None, steps=args.steps, warmup=3, width=args.width,
                                        depth=args.depth, batch=args.batch, bucket_cap_mb=25.0)
            times[mode] += t
            sums[mode].append(checksum)
    torch.use_deterministic_algorithms(False)
    result = {mode: {"median_ms": statistics.median(t) * 1e3, "steps": len(t),
                     "checksums": sorted(set(sums[mode]))} for mode, t in times.items()}
    result["on_vs_off"] = result["on"]["median_ms"] / result["off"]["median_ms"]
    if dist.get_rank() == 0:
        print(f"DDP step, {args.backend}, {dist.get_world_size()} ranks: deterministic off "
              f"{result['off']['median_ms']:.2f} ms, on {result['on']['median_ms']:.2f} ms "
              f"({result['on_vs_off']:.2f}x); checksums of the deterministic rounds: "
              f"{len(result['on']['checksums'])} distinct")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
