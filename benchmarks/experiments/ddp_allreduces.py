#!/usr/bin/env python3
"""What a DDP step of examples/ddp_train.py asks of the pycoll group: its collectives, read
back from the communicator's flight recorder (size, the path that ran it, the time it waited
behind other calls, the time it ran) after ``--steps`` steps.

    python -m pycoll.run -n 2 benchmarks/experiments/ddp_allreduces.py [--steps 20] [--last 8]

DDP's allreduces are asynchronous (issued from its reducer during backward), so they run on
the communicator's worker thread, and their records carry the three times.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
from pathlib import Path

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401
from pycoll.runtime.flight_recorder import INFO, SEQ, T_ENDED, T_SCHEDULED, T_STARTED

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--last", type=int, default=8, help="records to print")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("ddp_train", ROOT / "examples" / "ddp_train.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)  # type: ignore[union-attr]
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    dist.init_process_group("pycoll")
    times, _ = ex.train(None, steps=args.steps, warmup=3, width=1024, depth=4, batch=32,
                        bucket_cap_mb=25.0)
    recorder = dist.group.WORLD.comm._exec.recorder
    records = sorted((r for r in recorder.ring if r is not None), key=lambda r: r[SEQ])
    if dist.get_rank() == 0:
        print(f"DDP step: median {statistics.median(times) * 1e3:.1f} ms over {len(times)} "
              f"steps; the last {args.last} collectives (rank 0):")
        for r in records[-args.last:]:
            info = r[INFO]
            queued = (r[T_STARTED] - r[T_SCHEDULED]) * 1e3 if r[T_SCHEDULED] else 0.0
            ran = (r[T_ENDED] - r[T_STARTED]) * 1e3 if r[T_ENDED] else float("nan")
            print(f"  #{r[SEQ]} {info.collective} {info.nbytes} B by {info.algorithm}: "
                  f"queued {queued:.3f} ms, ran {ran:.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
