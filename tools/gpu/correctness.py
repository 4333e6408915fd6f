"""The CUDA correctness matrix with a time limit per configuration, results printed at once.

Run by tools/gpu_checks.sh on the GPU machine:

    python3 tools/gpu/correctness.py smoke          # torch, 2 ranks, cuda_ipc; stream order
    python3 tools/gpu/correctness.py matrix K M     # the K-th of M interleaved slices

It runs tests/cuda's rank functions (every collective, op and dtype against the CPU
reference; stream order) through pycoll.testing.run_ranks with spawned ranks, so that one
configuration that hangs costs its own limit, not the stage's, and every line says
OK / WRONG / FAILED with the configuration.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "cuda"))

from test_cuda_collectives import _every_collective, _stream_order  # noqa: E402

from pycoll.testing import run_ranks  # noqa: E402

CONFIGS = [(kind, n, transport) for n in (2, 4, 3) for transport in ("cuda_ipc", "shm", "tcp")
           for kind in ("torch", "cupy")]


def one(kind: str, n: int, transport: str, limit: float) -> str:
    start = time.monotonic()
    name = f"{kind}-{n}-{transport}"
    try:
        results = run_ranks(_every_collective, n, kind, timeout=limit, collective_timeout=30,
                            env={"PYCOLL_TRANSPORTS": transport}, start_method="spawn")
    except Exception as e:          # the line reports any failure
        took = time.monotonic() - start
        return f"{name}: FAILED {took:.0f}s {type(e).__name__}: {str(e)[-2000:]}"
    bad = [(rank, failures[:6]) for rank, (failures, _, _) in enumerate(results) if failures]
    checked = [c for _, c, _ in results]
    return (f"{name}: {'WRONG' if bad else 'OK'} checked={checked} via {results[0][2]} "
            f"{bad if bad else ''} {time.monotonic() - start:.0f}s")


def stream(transport: str) -> str:
    try:
        res = run_ranks(_stream_order, 2, timeout=60, env={"PYCOLL_TRANSPORTS": transport},
                        start_method="spawn")
    except Exception as e:
        return f"stream-{transport}: FAILED {type(e).__name__}: {str(e)[-2000:]}"
    ok = all(first == last == 2 * total and again == 2 * total
             for first, last, again, total in res)
    return f"stream-{transport}: {'OK' if ok else 'WRONG'} {res}"


def main() -> int:
    """Exit status 1 when any line is not OK, so that summary.txt shows it."""
    if sys.argv[1] == "smoke":
        lines = [one("torch", 2, "cuda_ipc", 150)]
        print(lines[-1], flush=True)
        for transport in ("cuda_ipc", "shm"):
            lines.append(stream(transport))
            print(lines[-1], flush=True)
    else:
        k, m = int(sys.argv[2]), int(sys.argv[3])
        lines = []
        for config in CONFIGS[k::m]:
            if config != ("torch", 2, "cuda_ipc"):      # the smoke stage ran it
                lines.append(one(*config, 75))
                print(lines[-1], flush=True)
    return 0 if all(": OK" in line for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
