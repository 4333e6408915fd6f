"""One rank of the placement test of deterministic reductions (test_deterministic_hosts.py):
the cases of ``cases()``, each rank's result as a digest, written to <out>/rank<r>.json."""
import hashlib
import json
import os
import socket
import sys

import numpy as np

import pycoll

try:
    import torch
except ImportError:      # an install without the torch extra: no bfloat16 cases
    torch = None

DTYPES = tuple(d for d in ("float16", "bfloat16", "float32", "float64")
               if torch is not None or d != "bfloat16")


def bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (no NaNs in this data). numpy, not
    torch: the test process forks ranks, and torch's thread pool does not survive a fork."""
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def is_tensor(x) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def f32(x) -> np.ndarray:
    if is_tensor(x):
        bits = x.contiguous().view(torch.int16).numpy().view(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(x, dtype=np.float32)


def inputs(rank: int, count: int, dtype: str, salt: int):
    rng = np.random.default_rng(1000 * salt + rank)
    spread = 3 if dtype == "float16" else 8
    values = rng.standard_normal(count) * 10.0 ** rng.integers(-spread, spread, count)
    if dtype == "bfloat16":
        return torch.from_numpy(bf16(values)).view(torch.bfloat16)
    return values.astype(dtype)


def cases():
    """(collective, dtype, count, salt): sizes across the fold's segments, every dtype."""
    out, salt = [], 0
    for coll in ("allreduce", "reduce_scatter"):
        for dtype in DTYPES:
            for count in (5, 4097, 300_000):
                salt += 1
                out.append((coll, dtype, count, salt))
    return out


def digest(x) -> str:
    raw = x.contiguous().view(torch.int16).numpy().tobytes() if is_tensor(
        x) else np.ascontiguousarray(x).tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def run(comm) -> dict:
    found = {}
    for coll, dtype, count, salt in cases():
        mine = inputs(comm.rank, count, dtype, salt)
        if coll == "allreduce":
            comm.allreduce(mine, deterministic=True)
            found[f"{coll}/{dtype}/{count}"] = digest(mine)
        else:
            per = count // comm.size
            out = (torch.from_numpy(mine[:per].view(torch.int16).numpy().copy())
                   .view(torch.bfloat16) if is_tensor(mine) else mine[:per].copy())
            comm.reduce_scatter(out, mine[:per * comm.size], deterministic=True)
            found[f"{coll}/{dtype}/{count}"] = digest(out)
    return found


if __name__ == "__main__":
    comm = pycoll.init(timeout=90)
    result = {"rank": comm.rank, "host": socket.gethostname(), "digests": run(comm),
              "algorithm": comm.selected_algorithm("allreduce", 1 << 20)}
    with open(os.path.join(sys.argv[1], f"rank{comm.rank}.json"), "w") as f:
        json.dump(result, f)
    pycoll.finalize()
