"""What every tests/torch scenario uses on its rank (worker.py runs one scenario per rank).

The rank's place in the job comes from the env:// variables; ``Checker`` collects every
mismatch instead of stopping at the first; ``data`` makes per-rank inputs that are exact in
every dtype; ``resources`` lists what pycoll still holds after the group is destroyed.
"""
from __future__ import annotations

import inspect
import os
import threading
import traceback

import torch
import torch.distributed as dist

import pycoll.torch  # noqa: F401  (registers "pycoll")
from pycoll.testing import fd_targets, mapped_segments
from pycoll.transports.shm.segment import SHM_DIR, name_prefix, segment_prefix

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
R = dist.ReduceOp


def barrier(group=None, timeout=None) -> None:
    """``dist.barrier(group=, timeout=)``. torch 2.11's ``dist.barrier`` has no timeout: there
    the options (whose ``timeout`` every torch has) go to the group's ``barrier`` itself."""
    if "timeout" in inspect.signature(dist.barrier).parameters:
        dist.barrier(group=group, timeout=timeout)
        return
    opts = dist.BarrierOptions()
    opts.timeout = timeout
    opts.device = torch.device("cpu")
    (group or dist.group.WORLD).barrier(opts).wait()


class Checker:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.checked = 0

    def same(self, what: str, got: torch.Tensor, want: torch.Tensor, exact: bool = True) -> None:
        self.checked += 1
        try:
            if got.shape != want.shape or got.dtype != want.dtype:
                raise AssertionError(f"shape/dtype {tuple(got.shape)} {got.dtype} != "
                                     f"{tuple(want.shape)} {want.dtype}")
            if exact or not got.is_floating_point():
                ok = torch.equal(got, want)
            else:
                tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(got.dtype, 1e-5)
                ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
            if not ok:
                diff = (got.double() - want.double()).abs().max().item()
                raise AssertionError(f"values differ (max abs diff {diff}); got "
                                     f"{got.reshape(-1)[:6].tolist()} want "
                                     f"{want.reshape(-1)[:6].tolist()}")
        except AssertionError as e:
            self.failures.append(f"{what}: {e}")

    def run(self, what: str, fn) -> None:
        try:
            fn()
        except Exception as e:
            self.failures.append(f"{what}: raised {type(e).__name__}: {e}\n"
                                 f"{traceback.format_exc()[-1500:]}")


def data(dtype: torch.dtype, n: int, rank: int, salt: int = 0) -> torch.Tensor:
    """Deterministic per-rank values that are exact in every dtype (small integers)."""
    base = (torch.arange(n, dtype=torch.int64) * 7 + rank * 13 + salt * 5) % 11
    if dtype == torch.uint8 or dtype == torch.bool:
        return base.to(dtype)
    return (base - 3).to(dtype)


def resources() -> dict:
    """pycoll resources this process still holds."""
    left = {}
    threads = [t.name for t in threading.enumerate() if t.name.startswith("pycoll-")]
    if threads:
        left["threads"] = threads
    shm = [f for f in os.listdir(SHM_DIR) if f.startswith(segment_prefix(os.getpid()))]
    if shm:
        left["shm files"] = shm
    maps = mapped_segments()
    if maps:
        left["shm mappings"] = sorted(maps)
    fds = [t for t in fd_targets() if "pidfd" in t or t.startswith(f"{SHM_DIR}/{name_prefix()}-")]
    if fds:
        left["fds"] = fds
    return left
