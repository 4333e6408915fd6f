"""Failure scenarios: a peer that dies mid-training, and collectives a peer never joins.
Both must raise (never hang), refuse later calls, and leave nothing behind.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from ddp_checks import Net
from rank_helpers import RANK, WORLD, barrier, resources


def scenario_peer_failure() -> dict:
    """Rank WORLD-1 dies (os._exit) in the middle of step 3; the others must raise."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = DDP(Net(), bucket_cap_mb=0.005)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    result: dict = {"steps": 0}
    for step in range(50):
        x = torch.randn(8, 16)
        loss = model(x).square().mean()
        if step == 3 and RANK == WORLD - 1:
            os._exit(17)   # a crash: no cleanup, no goodbye
        t0 = time.monotonic()
        try:
            loss.backward()
            opt.step()
            opt.zero_grad()
            result["steps"] = step + 1
        except RuntimeError as e:
            result.update(error_type=type(e).__name__, error=str(e)[:800],
                          seconds=round(time.monotonic() - t0, 2))
            break
    # the group is failed now: later collectives raise at once, they never hang
    try:
        dist.all_reduce(torch.ones(3))
        result["after"] = "no error"
    except RuntimeError as e:
        result["after"] = f"{type(e).__name__}: {str(e)[:300]}"
    w = None
    try:
        w = dist.all_reduce(torch.ones(3), async_op=True)
        w.get_future().wait()
        result["future_after"] = "no error"
    except RuntimeError as e:
        result["future_after"] = f"{type(e).__name__}"
    dist.destroy_process_group()
    result["leftovers"] = resources()
    return result


def scenario_timeout() -> dict:
    """Rank 1 skips collectives; rank 0's time out (group timeout 3 s, barrier 1 s)."""
    store = None
    dist.init_process_group("pycoll", timeout=timedelta(seconds=3))
    store = dist.distributed_c10d._get_default_store()
    sub = dist.new_group(backend="pycoll")          # default timeout (1800 s)
    result: dict = {}
    if RANK == 0:
        t0 = time.monotonic()
        try:
            barrier(group=sub, timeout=timedelta(seconds=1))
            result["barrier"] = "no error"
        except RuntimeError as e:
            result["barrier"] = type(e).__name__
        result["barrier_s"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1000), async_op=True).get_future().wait()
            result["future"] = "no error"
        except RuntimeError as e:
            result["future"] = type(e).__name__
            result["future_msg"] = str(e)[:400]
        result["future_s"] = round(time.monotonic() - t0, 2)
        try:
            dist.all_reduce(torch.ones(10), async_op=True).wait()
            result["wait"] = "no error"
        except RuntimeError as e:
            result["wait"] = type(e).__name__
        store.set("rank0_done", "1")
    else:
        store.wait(["rank0_done"], timedelta(seconds=60))
    dist.destroy_process_group()
    result["leftovers"] = resources()
    return result

