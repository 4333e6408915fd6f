"""DDP training that survives a killed rank and grows back (docs/elastic.md).

    python -m pycoll.run --elastic --max-restarts 1 -n 4 examples/elastic_ddp.py \\
        --steps 40 --kill-rank 2 --kill-step 10 --replacements 1 --out losses.txt

Every step trains on the same global batch (``--batch`` samples, split evenly over the ranks
there are), so the loss curve does not depend on how many ranks share the work: it matches
an uninterrupted run (``--kill-rank -1``) up to float rounding. The rank ``--kill-rank``
SIGKILLs itself in step ``--kill-step``, after its forward pass. The survivors' backward
raises; they agree on who is gone, shrink the default group (``torch.distributed.shrink_group``),
take rank 0's model and step (the failed step is redone as 3 ranks), and every few steps
call ``pycoll.torch.grow_group()``, which admits the
replacement the launcher started (``--max-restarts``; ``--replacements``: wait for it at
the next grow after a loss); it joins with
``pycoll.torch.join_group()`` and gets the model and the step from rank 0 (DDP replicas are
identical: no checkpoint needed). Rank 0 of the group appends "step loss ranks" to ``--out``.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll
import pycoll.torch


def make_model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, 1))


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def sync_from_rank0(net: torch.nn.Module, step: int) -> int:
    """Every replica takes rank 0's parameters and step (a joiner has neither)."""
    for p in net.parameters():
        dist.broadcast(p.data, src=0)
    t = torch.tensor([step], dtype=torch.int64)
    dist.broadcast(t, src=0)
    return int(t.item())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=48, help="global batch: divisible by every "
                    "world size the job passes through")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=10)
    ap.add_argument("--grow-every", type=int, default=5)
    ap.add_argument("--replacements", type=int, default=0, help="replacements the launcher "
                    "starts (its --max-restarts): after a shrink, the next grow waits for one")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    net = make_model(args.width)
    joining = os.environ.get("PYCOLL_JOIN") == "1"
    if joining:
        pycoll.torch.join_group()            # waits until the members grow
    else:
        dist.init_process_group("pycoll")
    first_rank = -1 if joining else dist.get_rank()
    step = sync_from_rank0(net, 0) if joining else 0
    expected = 0                           # replacements to wait for at the next grow
    recovering = False                     # the next step is the first after a shrink
    model = DDP(net)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    while step < args.steps:
        rank, size = dist.get_rank(), dist.get_world_size()
        try:
            x, y = global_batch(step, args.batch)
            mine = slice(rank * args.batch // size, (rank + 1) * args.batch // size)
            loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
            if step == args.kill_step and first_rank == args.kill_rank:
                print(f"rank {rank}: SIGKILL at {time.time():.6f}", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            loss.backward()
            total = loss.detach() * (args.batch // size)     # sum of squared errors here
            dist.all_reduce(total)
            opt.step()
            opt.zero_grad()
            if rank == 0 and args.out:
                with open(args.out, "a") as f:
                    f.write(f"{step} {total.item() / args.batch:.9g} {size}\n")
            if recovering:
                recovering = False
                print(f"rank {rank}: first step after shrinking done at {time.time():.6f}",
                      file=sys.stderr, flush=True)
            step += 1
            if args.grow_every and step % args.grow_every == 0 and step < args.steps:
                before = dist.group.WORLD
                started = time.monotonic()
                # admit whoever waits; after a loss with a replacement coming, wait for it
                pycoll.torch.grow_group(expected or None, timeout=120)
                expected = 0
                if dist.group.WORLD is not before:
                    step = sync_from_rank0(net, step)
                    model = DDP(net)
                    print(f"rank {dist.get_rank()}: grew to {dist.get_world_size()} ranks in "
                          f"{time.monotonic() - started:.3f} s", file=sys.stderr, flush=True)
        except (RuntimeError, pycoll.PycollError) as e:
            # a rank died (here, or while another call ran): agree on who is gone, shrink,
            # and go on from rank 0's model and step (DDP replicas are identical: no
            # checkpoint; a step that failed anywhere was applied nowhere but maybe on a rank
            # that finished it, and rank 0's state is the one everyone takes)
            opt.zero_grad()
            _, gone = dist.group.WORLD.comm.agree(1)
            print(f"rank {rank}: step {step} failed ({type(e).__name__}); ranks "
                  f"{sorted(gone)} are gone: shrinking", file=sys.stderr, flush=True)
            dist.shrink_group(sorted(gone))
            step = sync_from_rank0(net, step)
            model = DDP(net)
            recovering = True
            if args.replacements > 0:
                args.replacements -= 1
                expected += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
