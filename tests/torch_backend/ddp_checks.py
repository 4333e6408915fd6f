"""DDP scenarios: training on the pycoll group and on a Gloo group must end with the same
parameters, on CPU (several DDP configurations) and with CUDA tensors.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from rank_helpers import RANK, WORLD, Checker, data


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 4)
        self.unused = torch.nn.Linear(64, 4)   # used only on even steps (find_unused)

    def forward(self, x: torch.Tensor, step: int = 0, skip: bool = False) -> torch.Tensor:
        h = torch.relu(self.b(torch.relu(self.a(x))))
        out = self.c(h)
        if skip and step % 2 == 0:
            return out
        return out + 0 * self.unused(h) if not skip else out + self.unused(h)


def train(group, *, steps: int = 4, hook=None, no_sync: bool = False, find_unused: bool = False,
          bucket_cap_mb: float = 25.0, dtype=torch.float32,
          device: str = "cpu") -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(1234 + RANK)   # different on each rank: DDP must broadcast rank 0's
    model = Net().to(dtype).to(device)
    ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_cap_mb,
              find_unused_parameters=find_unused)
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(99 + RANK)
    for step in range(steps):
        opt.zero_grad()
        if no_sync:
            with ddp.no_sync():
                x = torch.randn(8, 16, generator=gen).to(dtype).to(device)
                ddp(x, step, find_unused).square().mean().backward()
        x = torch.randn(8, 16, generator=gen).to(dtype).to(device)
        ddp(x, step, find_unused).square().mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def scenario_ddp() -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    pyc = dist.group.WORLD
    c = Checker()
    configs = {
        "default buckets": {},
        "small buckets": {"bucket_cap_mb": 0.005},
        "allreduce_hook": {"hook": hooks.allreduce_hook},
        "fp16_compress_hook": {"hook": hooks.fp16_compress_hook},
        "no_sync": {"no_sync": True},
        "find_unused_parameters": {"find_unused": True, "bucket_cap_mb": 0.005},
        "float64": {"dtype": torch.float64},
    }
    exact = WORLD <= 2
    for name, cfg in configs.items():
        def check(name=name, cfg=cfg):
            a = train(pyc, **cfg)
            b = train(gloo, **cfg)
            for i, (x, y) in enumerate(zip(a, b)):
                c.same(f"DDP {name} param {i}", x, y, exact)
            # and every rank holds the same parameters
            flat = torch.cat([p.reshape(-1).double() for p in a])
            ref = flat.clone()
            dist.broadcast(ref, 0)
            c.same(f"DDP {name}: ranks agree", flat, ref)
        c.run(f"DDP {name}", check)
    dist.destroy_process_group()
    return {"failures": c.failures, "checked": c.checked}


def scenario_cuda() -> dict:
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    c = Checker()
    dev = torch.device("cuda", RANK % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        t = data(dtype, 10001, RANK).to(dev)
        dist.all_reduce(t)
        s = data(dtype, 10001, RANK)
        dist.all_reduce(s, group=gloo)
        c.same(f"cuda all_reduce {dtype}", t.cpu(), s)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        out = torch.empty(WORLD * 7, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, data(dtype, 7, RANK).to(dev))
        want = torch.empty(WORLD * 7, dtype=dtype)
        dist.all_gather_into_tensor(want, data(dtype, 7, RANK), group=gloo)
        c.same(f"cuda all_gather_into_tensor {dtype}", out.cpu(), want)
    a = train(dist.group.WORLD, steps=3, device=str(dev))
    b = train(gloo, steps=3)
    for i, (x, y) in enumerate(zip(a, b)):
        c.same(f"cuda DDP param {i}", x.cpu(), y, exact=False)
    dist.destroy_process_group()
    return {"failures": c.failures, "checked": c.checked}

