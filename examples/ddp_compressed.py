"""Train a small model with DistributedDataParallel over the "pycoll" backend, with gradients
averaged uncompressed and with compress= (bf16, fp8, int8; with and without error feedback),
and compare the loss curves.

    python -m pycoll.run -n 2 examples/ddp_compressed.py
    python -m pycoll.run -n 4 examples/ddp_compressed.py --steps 200 --variants none,fp8,fp8+ef

Every variant starts from the same weights and sees the same batches (each rank its own);
the loss is the mean squared error of a fixed held-out set, the same on every rank; after
each variant every rank checks that its weights are rank 0's, bit for bit. Rank 0
prints the curve (every ``--every`` steps) and, per variant, a line

    final <variant> initial=<loss> final=<loss> ratio=<final / uncompressed final>

which tests/algorithms/test_compression.py reads (docs/numerics.md, "Training").
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import pycoll.torch  # noqa: F401  (registers the "pycoll" backend)
from pycoll.torch import CompressHookState, compressed_allreduce_hook

INPUTS = 32


def make_model(width: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(INPUTS, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, 1))


def teacher(x: torch.Tensor) -> torch.Tensor:
    """The function to learn: fixed, smooth, the same on every rank."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(INPUTS, 8, generator=gen) / INPUTS ** 0.5
    return torch.sin(x @ w).sum(dim=1, keepdim=True)


def train(variant: str, *, steps: int, width: int, batch: int, lr: float,
          every: int) -> list[float]:
    """The held-out loss before training and every ``every`` steps (the last: the end)."""
    rank = dist.get_rank()
    model = DDP(make_model(width))
    if variant != "none":
        fmt, _, ef = variant.partition("+")
        model.register_comm_hook(CompressHookState(fmt, error_feedback=ef == "ef"),
                                 compressed_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)          # each rank its own batches
    held = torch.randn(512, INPUTS, generator=torch.Generator().manual_seed(99))
    held_y = teacher(held)

    def held_out() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model.module(held), held_y))

    curve = [held_out()]
    for step in range(1, steps + 1):
        x = torch.randn(batch, INPUTS, generator=gen)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), teacher(x)).backward()
        opt.step()
        if step % every == 0 or step == steps:
            curve.append(held_out())
    # every rank got the same averaged gradients (the same bits: docs/numerics.md), so every
    # rank's weights must be the same bits too
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    if not torch.equal(flat, ref):
        raise RuntimeError(f"rank {rank}: {variant}: weights differ from rank 0's")
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--variants", default="none,bf16,bf16+ef,fp8,fp8+ef,int8,int8+ef",
                    help="comma-separated: none, a format, or format+ef (error feedback)")
    args = ap.parse_args()
    variants = args.variants.split(",")
    if variants[0] != "none":
        variants.insert(0, "none")           # the reference every ratio is against
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    dist.init_process_group("pycoll")
    rank = dist.get_rank()
    curves = {v: train(v, steps=args.steps, width=args.width, batch=args.batch, lr=args.lr,
                       every=args.every) for v in variants}
    if rank == 0:
        ref = curves["none"][-1]
        print(f"held-out loss every {args.every} steps, world={dist.get_world_size()}")
        for v, c in curves.items():
            print(f"{v:>8}: " + " ".join(f"{x:.4f}" for x in c))
        for v, c in curves.items():
            print(f"final {v} initial={c[0]:.6g} final={c[-1]:.6g} ratio={c[-1] / ref:.4f}",
                  flush=True)
    dist.barrier()  # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
