"""Groups over the default group's channels, and a 2-D DeviceMesh step against Gloo.

``scenario_mesh`` (4 ranks): the default group opens a channel to every peer; then
``new_group``, ``new_subgroups`` and ``init_device_mesh("cpu", (2, 2))`` make groups whose
collectives must be right and must open no channel, socket or channel segment of their own
(the counts per rank before and after are returned). Then FSDP2 (``fully_shard`` on the dp
dimension) with tensor parallelism (ColwiseParallel/RowwiseParallel on tp) trains a small MLP
for 3 steps on the pycoll mesh and on a Gloo mesh over the same ranks: losses and the full
parameters must agree.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from rank_helpers import RANK, WORLD, Checker

from pycoll.testing import held_counts

STEPS = 3
#: every reduction is over the 2 ranks of a mesh dimension, and a + b == b + a whatever the
#: algorithm, so the runs agree bit for bit ("exact", which the test requires); the tolerance
#: check says by how much they would differ if not
RTOL, ATOL = 1e-6, 1e-7


def check_group(c: Checker, what: str, group) -> None:
    """all_gather of the global ranks and an all_reduce on ``group``; sequence numbers agree
    across the members and count the calls."""
    ranks = dist.get_process_group_ranks(group)
    n = len(ranks)
    before = group._get_sequence_number_for_group()
    out = torch.zeros(n, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([RANK]), group=group)
    c.same(f"{what}: all_gather of global ranks", out, torch.tensor(ranks))
    t = torch.full((5,), float(RANK + 1))
    dist.all_reduce(t, group=group)
    c.same(f"{what}: all_reduce", t, torch.full((5,), float(sum(r + 1 for r in ranks))))
    seq = group._get_sequence_number_for_group()
    seqs = torch.zeros(n, dtype=torch.int64)
    dist.all_gather_into_tensor(seqs, torch.tensor([seq]), group=group)
    c.same(f"{what}: sequence numbers agree", seqs, torch.full((n,), seq))
    c.same(f"{what}: sequence number counts the calls", torch.tensor(seq - before),
           torch.tensor(2))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def train_2d(mesh) -> tuple[list[float], list[torch.Tensor]]:
    """FSDP2 on mesh["dp"] over TP on mesh["tp"]: losses of each step, full parameters."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    torch.manual_seed(0)                              # the same model on every rank
    model = MLP()
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    dp = mesh["dp"].get_local_rank()                  # tp ranks must see the same batch
    losses = []
    for step in range(STEPS):
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(100 * dp + step))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.full_tensor().detach().clone() for p in model.parameters()]


def scenario_mesh() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    assert WORLD == 4
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    world = dist.group.WORLD
    c = Checker()
    # a channel to every peer: all_to_all talks to each one
    dist.all_to_all_single(torch.zeros(WORLD * 4), torch.ones(WORLD * 4))
    result: dict = {"before": held_counts(world.comm)}

    c.run("new_group of all", lambda: check_group(c, "new_group()", dist.new_group()))
    for ranks in ([0, 2], [1, 2, 3]):
        group = dist.new_group(ranks)
        if RANK in ranks:
            c.run(f"new_group {ranks}", lambda g=group, r=ranks: check_group(
                c, f"new_group({r})", g))
    local = dist.new_group([RANK], use_local_synchronization=True)
    c.run("local group", lambda: check_group(c, "new_group([own rank], local sync)", local))
    sub, _ = dist.new_subgroups(2)
    c.run("new_subgroups", lambda: check_group(c, "new_subgroups(2)", sub))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        c.run(f"mesh {dim}", lambda d=dim: check_group(c, f"mesh[{d}]", mesh[d].get_group()))
    result["after groups"] = held_counts(world.comm)
    result["groups"] = len(world.comm._groups.children)

    losses, params = train_2d(mesh)
    result["after training"] = held_counts(world.comm)

    gloo_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"),
                                 backend_override={"dp": "gloo", "tp": "gloo"})
    if dist.get_backend(gloo_mesh["dp"].get_group()) != "gloo":
        c.failures.append("the reference mesh is not on gloo")
    want_losses, want_params = train_2d(gloo_mesh)
    c.same("losses", torch.tensor(losses), torch.tensor(want_losses), exact=False)
    exact = torch.equal(torch.tensor(losses), torch.tensor(want_losses))
    for i, (got, want) in enumerate(zip(params, want_params)):
        c.checked += 1
        if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            c.failures.append(f"param {i}: max abs diff {(got - want).abs().max().item()}")
        exact = exact and torch.equal(got, want)
    result.update(losses=losses, gloo_losses=want_losses, exact=exact)

    dist.destroy_process_group(sub)                  # a subgroup alone: the world still works
    t = torch.ones(3)
    dist.all_reduce(t)
    c.same("world after destroying a subgroup", t, torch.full((3,), float(WORLD)))
    result["after destroying a subgroup"] = held_counts(world.comm)
    dist.destroy_process_group()
    result.update(failures=c.failures, checked=c.checked)
    return result


def scenario_own_channels() -> dict:
    from rank_helpers import resources
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    group = dist.new_group(backend="pycoll")
    c = Checker()
    t = torch.full((4,), float(RANK + 1))
    dist.all_reduce(t, group=group)
    c.same("all_reduce on the pycoll group", t, torch.full((4,), float(sum(range(1, WORLD + 1)))))
    result = {"own": group.comm._is_root}
    dist.destroy_process_group()
    result.update(failures=c.failures, checked=c.checked, leftovers=resources())
    return result
