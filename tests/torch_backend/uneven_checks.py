"""The uneven scenario: torch's uneven variants that the pycoll backend maps onto pycoll's
``v`` calls (``dist.reduce_scatter`` with input lists of different sizes, zeros among them:
``Communicator.reduce_scatter_v``; ``dist.all_gather`` into tensors of different sizes:
``allgatherv``), against a reference computed on the rank from every
rank's known inputs (small integers: exact sums in every dtype)."""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from rank_helpers import RANK, WORLD, Checker, R, data


def scenario_uneven() -> dict:
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    c = Checker()
    counts = [0 if r == 0 else 3 * r + 1 for r in range(WORLD)]   # rank 0's block: empty

    def reduce_scatter_uneven() -> None:
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for op in (R.SUM, R.MAX):
                for async_op in (False, True):
                    out = torch.full((counts[RANK],), 99, dtype=dtype)
                    ins = [data(dtype, counts[i], RANK, salt=i) for i in range(WORLD)]
                    work = dist.reduce_scatter(out, ins, op=op, async_op=async_op)
                    if async_op:
                        work.wait()
                    mine = torch.stack([data(dtype, counts[RANK], r, salt=RANK)
                                        for r in range(WORLD)])
                    want = mine.sum(0).to(dtype) if op == R.SUM else mine.max(0).values
                    c.same(f"reduce_scatter uneven {dtype} {op} async={async_op}", out, want)
                    c.same(f"reduce_scatter uneven {dtype} inputs unchanged", ins[-1],
                           data(dtype, counts[-1], RANK, salt=WORLD - 1))

    c.run("reduce_scatter uneven", reduce_scatter_uneven)

    def all_gather_uneven() -> None:
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for async_op in (False, True):
                outs = [torch.full((counts[r], 2), 99, dtype=dtype) for r in range(WORLD)]
                mine = data(dtype, counts[RANK] * 2, RANK).reshape(-1, 2)
                work = dist.all_gather(outs, mine, async_op=async_op)
                if async_op:
                    work.wait()
                for r in range(WORLD):
                    c.same(f"all_gather uneven {dtype} async={async_op} from {r}", outs[r],
                           data(dtype, counts[r] * 2, r).reshape(-1, 2))

    c.run("all_gather uneven", all_gather_uneven)
    dist.destroy_process_group()
    return {"failures": c.failures, "checked": c.checked}
