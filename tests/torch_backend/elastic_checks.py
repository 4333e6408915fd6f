"""torch.distributed.shrink_group on pycoll's groups: a rank dies mid-training, the survivors
shrink the default group and train on (docs/elastic.md)."""
from __future__ import annotations

import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist
from ddp_checks import Net
from rank_helpers import RANK, WORLD


def scenario_shrink_group() -> dict:
    """Rank WORLD-1 SIGKILLs itself in step 3; the others catch the error from backward,
    ``dist.shrink_group([WORLD-1])`` (flag from $SHRINK_FLAGS), re-wrap the model in DDP and
    train 5 more steps; every survivor must end with the same parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    import pycoll.torch  # noqa: F401  (registers the backend)
    result: dict = {}
    torch.manual_seed(0)
    net = Net()
    model = DDP(net, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(50):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step * 100 + RANK))
        loss = model(x).square().mean()
        if step == 3 and RANK == WORLD - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
            opt.step()
            opt.zero_grad()
        except RuntimeError as e:
            result["error"] = str(e)[:300]
            result["failed_step"] = step
            break
    opt.zero_grad()
    flags = int(os.environ.get("SHRINK_FLAGS", "0"))
    result["supports_shrinking"] = dist.group.WORLD._get_backend(
        torch.device("cpu")).supports_shrinking
    group = dist.shrink_group([WORLD - 1], shrink_flags=flags)
    result.update(new_size=dist.get_world_size(), new_rank=dist.get_rank(),
                  is_default=group is dist.group.WORLD,
                  backend=dist.get_backend(), name=dist.group.WORLD.group_name)
    model = DDP(net, bucket_cap_mb=0.005)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1000 + step))
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    result["replicas_equal"] = all(torch.equal(g, gathered[0]) for g in gathered)
    x = torch.ones(3)
    dist.all_reduce(x)
    result["sum"] = x.tolist()
    dist.destroy_process_group()
    return result


def scenario_shrink_subgroup() -> dict:
    """A group of ranks 0..WORLD-2 drops its last (live) rank: the others call
    ``dist.shrink_group([WORLD-2], group=sub)`` (the excluded rank does not call, as torch
    requires), reduce on the shrunk group, and every rank then uses the default group,
    which the shrink of another group leaves as it was."""
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    result: dict = {}
    members = list(range(WORLD - 1))
    sub = dist.new_group(members)
    if RANK < WORLD - 2:
        old = sub
        new = dist.shrink_group([WORLD - 2], group=sub)
        t = torch.full((4,), float(RANK + 1))
        dist.all_reduce(t, group=new)
        result.update(size=new.size(), ranks=dist.get_process_group_ranks(new), sum=t.tolist(),
                      is_default=new is dist.group.WORLD,
                      shares_channels=new.comm._conn is dist.group.WORLD.comm._conn)
        try:
            dist.all_reduce(torch.ones(1), group=old)
            result["old_group"] = "no error"
        except Exception as e:  # noqa: BLE001 - the old group must refuse
            result["old_group"] = type(e).__name__
    t = torch.ones(1)
    dist.all_reduce(t)
    result["world_sum"] = t.item()
    dist.destroy_process_group()
    return result
