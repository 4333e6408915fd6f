"""Extra memory a large allreduce needs per rank, beyond the tensor itself.

Usage: ``python -m pycoll.run -n 2 benchmarks/memory.py [--size 512M] [--transport shm|tcp]``.
Each rank allocates and touches the tensor, notes its peak RSS (VmHWM), runs the allreduce
a few times, and prints how much the peak grew: the scratch pycoll needed.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import pycoll
from pycoll.bench.options import parse_size


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="512M")
    args = ap.parse_args()
    nbytes = parse_size(args.size)
    comm = pycoll.init()
    tensor = np.ones(nbytes // 4, dtype=np.float32)
    comm.allreduce(np.ones(1024, dtype=np.float32))   # warm up channels and scratch
    before = _vm("VmHWM")
    for _ in range(3):
        comm.allreduce(tensor)
    grown = _vm("VmHWM") - before
    line = (f"rank {comm.rank}: {args.size} allreduce over {comm.transport_summary()}: peak RSS "
            f"{before / 2**20:.0f} MiB before, grew by {grown / 2**20:.1f} MiB "
            f"({grown / nbytes * 100:.2f}% of the tensor)\n")
    os.write(1, line.encode())
    pycoll.finalize()


if __name__ == "__main__":
    main()
