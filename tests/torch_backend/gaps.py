"""Scenarios for the gaps to Gloo closed in pycoll's torch backend (run by worker.py).

Each runs the same calls on the pycoll group and on a Gloo group over the same ranks and
records every difference: all_gather_coalesced (torch's [rank][i] layout, shapes that cannot
hide a transposition, empty and complex tensors), sparse COO all_reduce (duplicate indices,
hybrid tensors), recv without src (any source, with three or more ranks, under both
profilers), complex tensors, and the profiler events themselves.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from rank_helpers import RANK, WORLD, Checker
from torch.profiler import profile

COMPARED_EVENTS = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
                   "all_to_all", "barrier", "send", "recv", "sparse_all_reduce")


def _groups():
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    return dist.group.WORLD, dist.new_group(backend="gloo")


def _inputs(rank: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Shapes differ per input, values per rank and input: a transposition cannot match.
    (torch requires one dtype per call.)"""
    ins = [torch.arange(2) + 10 * rank + 1, torch.arange(6).reshape(2, 3) * (rank + 1) + 100,
           torch.empty(0), torch.arange(4).reshape(2, 1, 2) - rank]
    if dtype.is_complex:
        return [(t + 1j * (rank + 1)).to(dtype) for t in ins]
    return [t.to(dtype) for t in ins]


def all_gather_coalesced_checks(c: Checker, pyc, gloo) -> None:
    for dtype in (torch.float32, torch.int64, torch.complex64):
        ins = _inputs(RANK, dtype)
        got = {}
        for name, g in (("pycoll", pyc), ("gloo", gloo)):
            outs = [[torch.full_like(t, -7) for t in ins] for _ in range(WORLD)]
            dist.all_gather_coalesced(outs, ins, group=g)
            got[name] = outs
            # the layout itself, independent of Gloo: outs[r][i] is rank r's input i
            for r in range(WORLD):
                for i, want in enumerate(_inputs(r, dtype)):
                    c.same(f"{name} all_gather_coalesced {dtype} [{r}][{i}] layout",
                           outs[r][i], want)
        for r in range(WORLD):
            for i in range(len(ins)):
                c.same(f"all_gather_coalesced {dtype} [{r}][{i}] vs gloo", got["pycoll"][r][i],
                       got["gloo"][r][i])
    # async, one input, the full group
    outs = [[torch.empty(5)] for _ in range(WORLD)]
    w = dist.all_gather_coalesced(outs, [torch.full((5,), float(RANK))], group=pyc,
                                  async_op=True)
    w.wait()
    for r in range(WORLD):
        c.same(f"async all_gather_coalesced [{r}]", outs[r][0], torch.full((5,), float(r)))


def _sparse(rank: int, dtype: torch.dtype, dense: bool) -> torch.Tensor:
    """Per-rank nonzero counts differ; indices repeat within a rank and across ranks."""
    nnz = 3 + 2 * rank
    idx = torch.tensor([[(k * 3 + rank) % 7 for k in range(nnz)]])
    idx = torch.cat([idx, torch.tensor([[0, 0]])], dim=1)          # duplicates within a rank
    if dense:
        vals = (torch.arange((nnz + 2) * 2).reshape(nnz + 2, 2) + rank).to(dtype)
        return torch.sparse_coo_tensor(idx, vals, (7, 2))
    vals = (torch.arange(nnz + 2) + rank * 10).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, (7,))


def sparse_checks(c: Checker, pyc, gloo) -> None:
    for dtype in (torch.float32, torch.float64, torch.int64):
        for dense in (False, True):
            for async_op in (False, True):
                res = {}
                for name, g in (("pycoll", pyc), ("gloo", gloo)):
                    t = _sparse(RANK, dtype, dense)
                    w = dist.all_reduce(t, group=g, async_op=async_op)
                    if async_op:
                        w.wait()
                    res[name] = t
                what = f"sparse all_reduce {dtype} dense={dense} async={async_op}"
                a, b = res["pycoll"], res["gloo"]
                if not (a.is_sparse and b.is_sparse):
                    c.failures.append(f"{what}: layouts {a.layout} {b.layout}")
                    continue
                a, b = a.coalesce(), b.coalesce()
                c.same(what + " indices", a.indices(), b.indices())
                c.same(what + " values", a.values(), b.values())
                c.same(what + " dense", a.to_dense(), b.to_dense())
                want = sum(_sparse(r, dtype, dense).to_dense() for r in range(WORLD))
                c.same(what + " vs dense sum", a.to_dense(), want)
    # a rank without any nonzero (Gloo handles it; packing must too)
    for name, g in (("pycoll", pyc), ("gloo", gloo)):
        t = (torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros(0),
                                     (7,)) if RANK == 0 else _sparse(RANK, torch.float32, False))
        dist.all_reduce(t, group=g)
        if name == "pycoll":
            mine = t.to_dense()
        else:
            c.same("sparse all_reduce with an empty rank", mine, t.to_dense())
    # a rank whose tensor has another size: every rank raises, and the group goes on
    t = torch.sparse_coo_tensor([[0]], [1.0], (5 if RANK == 0 else 4,))
    try:
        dist.all_reduce(t, group=pyc)
        c.failures.append("sparse all_reduce of mismatched sizes did not raise")
    except Exception as e:  # noqa: BLE001 - the message is what we check
        if "rank 1's tensor" not in str(e) or "rank 0's" not in str(e):
            c.failures.append(f"sparse mismatch error unclear: {e}")
    try:
        dist.all_reduce(_sparse(RANK, torch.float32, False), op=dist.ReduceOp.MAX, group=pyc)
        c.failures.append("sparse all_reduce MAX did not raise")
    except Exception as e:  # noqa: BLE001
        if "SUM" not in str(e):
            c.failures.append(f"sparse MAX error unclear: {e}")
    t = torch.ones(3)
    dist.all_reduce(t, group=pyc)
    c.same("all_reduce after sparse errors", t, torch.full((3,), float(WORLD)))


def any_source_checks(c: Checker, pyc, gloo, label: str) -> None:
    """Rank 0 receives 2 messages from every other rank without naming the source; each
    source's messages must arrive in its order and the reported source must be right."""
    for name, g in (("pycoll", pyc), ("gloo", gloo)):
        if RANK == 0:
            seen: dict[int, list[int]] = {}
            for _ in range(2 * (WORLD - 1)):
                t = torch.zeros(4, dtype=torch.int64)
                src = dist.recv(t, group=g, tag=3)
                if not torch.equal(t[1:], torch.full((3,), int(t[0]))):
                    c.failures.append(f"{label} {name} any-source payload torn: {t.tolist()}")
                if int(t[0]) // 100 != src:
                    c.failures.append(f"{label} {name}: recv returned src {src} for a message "
                                      f"from rank {int(t[0]) // 100}")
                seen.setdefault(src, []).append(int(t[0]) % 100)
            want = {r: [0, 1] for r in range(1, WORLD)}
            c.checked += 1
            if seen != want:
                c.failures.append(f"{label} {name} any-source order/sources {seen} != {want}")
            # irecv without src, async, then its source rank
            t = torch.zeros(4, dtype=torch.int64)
            w = dist.irecv(t, group=g, tag=4)
            w.wait()
            c.checked += 1
            if w._source_rank() != WORLD - 1 or int(t[0]) != 100 * (WORLD - 1) + 7:
                c.failures.append(f"{label} {name} irecv any: {w._source_rank()} {t.tolist()}")
        else:
            for k in range(2):
                dist.send(torch.full((4,), 100 * RANK + k, dtype=torch.int64), 0, group=g,
                          tag=3)
            if RANK == WORLD - 1:
                dist.send(torch.full((4,), 100 * RANK + 7, dtype=torch.int64), 0, group=g,
                          tag=4)
        dist.barrier(group=g)


def complex_checks(c: Checker, pyc, gloo) -> None:
    for dtype in (torch.complex64, torch.complex128):
        base = (torch.arange(9) + 1j * torch.arange(9) * (RANK + 1)).to(dtype)
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            t = base.clone()
            dist.all_reduce(t, op=op, group=pyc)
            s = base.clone()
            dist.all_reduce(s, group=gloo)
            if op == dist.ReduceOp.AVG:
                s = s / WORLD
            c.same(f"complex all_reduce {dtype} {op}", t, s, exact=False)
        t = base.clone()
        dist.broadcast(t, 1 % WORLD, group=pyc)
        s = base.clone()
        dist.broadcast(s, 1 % WORLD, group=gloo)
        c.same(f"complex broadcast {dtype}", t, s)
        outs = [torch.empty_like(base) for _ in range(WORLD)]
        want = [torch.empty_like(base) for _ in range(WORLD)]
        dist.all_gather(outs, base, group=pyc)
        dist.all_gather(want, base, group=gloo)
        for r in range(WORLD):
            c.same(f"complex all_gather {dtype} [{r}]", outs[r], want[r])
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX, group=pyc)
        c.failures.append("complex MAX did not raise")
    except Exception:  # noqa: BLE001 - torch itself refuses it first; any refusal will do
        c.checked += 1


def scenario_gaps() -> dict:
    pyc, gloo = _groups()
    c = Checker()
    c.run("all_gather_coalesced", lambda: all_gather_coalesced_checks(c, pyc, gloo))
    c.run("sparse", lambda: sparse_checks(c, pyc, gloo))
    c.run("any source", lambda: any_source_checks(c, pyc, gloo, "plain"))
    with profile(record_shapes=True):
        c.run("any source (torch.profiler)", lambda: any_source_checks(c, pyc, gloo, "kineto"))
    with torch.autograd.profiler.profile(record_shapes=True):
        c.run("any source (autograd profiler)",
              lambda: any_source_checks(c, pyc, gloo, "autograd"))
    c.run("complex", lambda: complex_checks(c, pyc, gloo))
    dist.destroy_process_group()
    return {"failures": c.failures, "checked": c.checked}


# --------------------------------------------------------------------------------------------
# profiler events: pycoll:<op> beside gloo:<op>, with the same input shapes

def _profiled_ops(g, prefix: str, async_op: bool) -> None:
    t = torch.ones(4, 3)
    works = []

    def run(w):
        if async_op and w is not None:
            works.append(w)

    run(dist.all_reduce(t, group=g, async_op=async_op))
    run(dist.broadcast(t, 0, group=g, async_op=async_op))
    run(dist.reduce(t, 0, group=g, async_op=async_op))
    run(dist.all_gather([torch.empty_like(t) for _ in range(WORLD)], t, group=g,
                        async_op=async_op))
    run(dist.gather(t, [torch.empty_like(t) for _ in range(WORLD)] if RANK == 0 else None, 0,
                    group=g, async_op=async_op))
    run(dist.scatter(t, [t.clone() for _ in range(WORLD)] if RANK == 0 else None, 0, group=g,
                     async_op=async_op))
    try:
        run(dist.all_to_all([torch.empty(2, 3) for _ in range(WORLD)],
                            [torch.ones(2, 3) for _ in range(WORLD)], group=g, async_op=async_op))
    except RuntimeError as e:     # torch 2.11's Gloo has no all_to_all (pycoll's must work)
        if prefix != "gloo:" or "does not support alltoall" not in str(e):
            raise
    run(dist.barrier(group=g, async_op=async_op))
    peer = (RANK + 1) % WORLD
    frm = (RANK - 1) % WORLD
    if RANK % 2 == 0:
        dist.send(t, peer, group=g)
        dist.recv(t, frm, group=g)
    else:
        dist.recv(t, frm, group=g)
        dist.send(t, peer, group=g)
    run(dist.all_reduce(torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (4,)), group=g,
                        async_op=async_op))
    for w in works:
        w.wait()


def _events(events, prefix: str) -> list[tuple[str, list]]:
    return [(e.name[len(prefix):], [list(s) for s in e.input_shapes])
            for e in events if e.name.startswith(prefix)]


def scenario_profiler() -> dict:
    pyc, gloo = _groups()
    c = Checker()
    result: dict = {}
    for kind in ("kineto", "autograd"):
        for async_op in (False, True):
            got = {}
            for prefix, g in (("pycoll:", pyc), ("gloo:", gloo)):
                ctx = (profile(record_shapes=True) if kind == "kineto"
                       else torch.autograd.profiler.profile(record_shapes=True))
                with ctx as p:
                    _profiled_ops(g, prefix, async_op)
                events = p.events() if kind == "kineto" else p.function_events
                got[prefix] = _events(events, prefix)
            label = f"{kind} async={async_op}"
            result[label] = got["pycoll:"]
            names = {n for n, _ in got["pycoll:"]}
            c.checked += 1
            for op in COMPARED_EVENTS:
                mine = sorted(s for n, s in got["pycoll:"] if n == op)
                theirs = sorted(s for n, s in got["gloo:"] if n == op)
                if op not in names:
                    c.failures.append(f"{label}: no pycoll:{op} event (got {sorted(names)})")
                elif theirs and mine != theirs:
                    c.failures.append(f"{label}: pycoll:{op} shapes {mine} != gloo's {theirs}")
    dist.destroy_process_group()
    result.update({"failures": c.failures, "checked": c.checked})
    return result
