"""Train a small MLP with DistributedDataParallel on the "pycoll" (or "gloo") backend.

    python -m pycoll.run -n 2 examples/ddp_train.py --backend pycoll
    python -m pycoll.run -n 2 examples/ddp_train.py --backend gloo
    torchrun --nproc-per-node 2 examples/ddp_train.py --backend pycoll

Prints the median step time (forward + backward with DDP's bucketed gradient allreduce +
optimizer step) over the timed steps, and a parameter checksum that is identical on every
rank (and across backends with 2 ranks).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll.torch  # noqa: F401  (registers the "pycoll" backend)


def make_model(width: int, depth: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = [torch.nn.Linear(256, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


def _bucket_as_is(state, bucket):  # type: ignore[no-untyped-def]
    """A DDP communication hook that communicates nothing (``train(sync=False)``). No
    annotations: DDP checks them against the real classes, and this module's are strings."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def train(group: dist.ProcessGroup | None, *, steps: int, warmup: int, width: int, depth: int,
          batch: int, bucket_cap_mb: float, sync: bool = True) -> tuple[list[float], float]:
    """Train ``steps`` steps; return (seconds per timed step, parameter checksum).

    ``sync=False`` gives DDP a communication hook that hands every gradient bucket back
    as it is: the same step (bucketing, copies, hooks) without the allreduce, i.e. the
    floor that no backend's step can go below (a benchmark's ceiling for any backend's
    speedup; the ranks' models then drift apart)."""
    rank = dist.get_rank()
    model = DDP(make_model(width, depth), process_group=group, bucket_cap_mb=bucket_cap_mb)
    if not sync:
        model.register_comm_hook(None, _bucket_as_is)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1000 + rank)
    times = []
    for step in range(warmup + steps):
        x = torch.randn(batch, 256, generator=gen)
        y = torch.randint(0, 10, (batch,), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    return times, checksum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="pycoll", help="pycoll or gloo (default pycoll)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (default: cores / local ranks)")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local))
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    times, checksum = train(None, steps=args.steps, warmup=args.warmup, width=args.width,
                            depth=args.depth, batch=args.batch, bucket_cap_mb=args.bucket_cap_mb)
    params = sum(p.numel() for p in make_model(args.width, args.depth).parameters())
    if rank == 0:
        q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
        print(f"backend={args.backend} world={world} params={params / 1e6:.2f}M "
              f"({params * 4 / 2**20:.1f} MiB of gradients per step) batch={args.batch}: "
              f"step time median {statistics.median(times) * 1e3:.1f} ms "
              f"(p10 {q[0] * 1e3:.1f}, p90 {q[-1] * 1e3:.1f}) over {len(times)} steps; "
              f"checksum {checksum:.6f}", flush=True)
    dist.barrier()  # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
