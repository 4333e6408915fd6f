"""The ops scenario: every torch.distributed op on the pycoll group and on a Gloo group over
the same ranks, with the same inputs; then destroy_process_group must release everything.
"""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from rank_helpers import FLOATS, INTS, RANK, WORLD, Checker, R, barrier, data, resources

from pycoll.errors import InvalidArgument
from pycoll.torch.arguments import PREMUL_FACTOR_READABLE


def _sync(opts):
    """``opts`` for a synchronous call (as ``dist.*`` makes them when ``async_op=False``)."""
    opts.asyncOp = False
    return opts


def scenario_ops() -> dict:
    dist.init_process_group("pycoll", timeout=timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    pyc = dist.group.WORLD
    exact = WORLD <= 2   # with 2 ranks a+b is order-independent: results must be bitwise equal
    c = Checker()
    sizes = [1, 37, 70001]

    def both(fn):
        """Run fn(group) on pycoll and on gloo; return both results."""
        return fn(pyc), fn(gloo)

    # all_reduce: every dtype and op gloo also has; AVG / PREMUL_SUM against gloo SUM
    def allreduce_checks():
        for dtype in FLOATS + INTS:
            ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
            if not dtype.is_floating_point:
                ops += [R.BAND, R.BOR, R.BXOR]
            for op in ops:
                for n in (sizes if op == R.SUM else sizes[:2]):
                    def f(g, op=op, n=n):
                        t = data(dtype, n, RANK)
                        if op == R.PRODUCT and dtype.is_floating_point:
                            t = t / 4 + 1
                        dist.all_reduce(t, op=op, group=g)
                        return t
                    a, b = both(f)
                    c.same(f"all_reduce {dtype} {op} n={n}", a, b,
                           exact or not dtype.is_floating_point)
            # AVG (gloo has none): the SUM divided by the world size
            for n in sizes[:2]:
                t = data(dtype, n, RANK)
                dist.all_reduce(t, op=R.AVG, group=pyc)
                s = data(dtype, n, RANK)
                dist.all_reduce(s, op=R.SUM, group=gloo)
                if dtype.is_floating_point:
                    want = (s.double() / WORLD).to(dtype)
                else:
                    want = torch.div(s, WORLD, rounding_mode="trunc")
                c.same(f"all_reduce {dtype} AVG n={n}", t, want, exact=not dtype.is_floating_point)
        if not PREMUL_FACTOR_READABLE:
            # the factor never reaches a Python backend: refused on every rank, data untouched
            t = data(torch.float32, 37, RANK)
            try:
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=pyc)
                c.failures.append("PREMUL_SUM without a readable factor was not refused")
            except InvalidArgument as e:
                if "ReduceOp.factor" not in str(e):
                    c.failures.append(f"PREMUL_SUM refusal does not say why: {e}")
            c.same("all_reduce PREMUL_SUM refused: tensor untouched", t,
                   data(torch.float32, 37, RANK))
        for dtype in FLOATS if PREMUL_FACTOR_READABLE else ():
            for factor in (0.5, torch.tensor([0.25])):
                t = data(dtype, 37, RANK)
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor), group=pyc)
                f = float(factor) if not isinstance(factor, torch.Tensor) else factor.item()
                s = data(dtype, 37, RANK) * f
                dist.all_reduce(s, group=gloo)
                c.same(f"all_reduce {dtype} PREMUL_SUM({f})", t, s, exact=False)
        # async: wait() and get_future()
        t = data(torch.float32, 1000, RANK)
        w = dist.all_reduce(t, async_op=True)
        fut_val = w.get_future().wait()
        w.wait()
        s = data(torch.float32, 1000, RANK)
        dist.all_reduce(s, group=gloo)
        c.same("all_reduce async", t, s)
        c.same("all_reduce async future value", fut_val[0], s)
        # non-contiguous and complex tensors
        m = data(torch.float32, 60, RANK).reshape(6, 10)
        col = m[:, 3]
        dist.all_reduce(col)
        m2 = data(torch.float32, 60, RANK).reshape(6, 10)
        col2 = m2[:, 3].contiguous()
        dist.all_reduce(col2, group=gloo)
        c.same("all_reduce non-contiguous", m[:, 3], col2)
        c.same("all_reduce non-contiguous leaves the rest", m[:, 4], m2[:, 4])
        z = torch.complex(data(torch.float32, 9, RANK), data(torch.float32, 9, RANK, 1))
        z2 = z.clone()
        dist.all_reduce(z)
        dist.all_reduce(z2, group=gloo)
        c.same("all_reduce complex", torch.view_as_real(z), torch.view_as_real(z2))

    c.run("all_reduce", allreduce_checks)

    def broadcast_checks():
        for dtype in FLOATS + INTS:
            for root in range(WORLD):
                a, b = both(lambda g: (lambda t: (dist.broadcast(t, root, group=g), t)[1])(
                    data(dtype, 70001, RANK)))
                c.same(f"broadcast {dtype} root={root}", a, b)
        t = data(torch.float64, 100, RANK)
        dist.broadcast(t, WORLD - 1, async_op=True).wait()
        c.same("broadcast async", t, data(torch.float64, 100, WORLD - 1))

    c.run("broadcast", broadcast_checks)

    # the synchronous lane remembers the numpy view of the last tensor (pycoll/torch/views.py):
    # the same tensor object, given new memory, dtype or layout between calls, must be
    # reduced where it lies now; and the work of a synchronous call is complete
    def reused_tensor_checks():
        def want_sum(t):
            s = t.clone()
            dist.all_reduce(s, group=gloo)
            return s

        t = data(torch.float32, 37, RANK)
        for step in range(3):
            want = want_sum(t)
            w = pyc.allreduce([t], _sync(dist.AllreduceOptions()))
            c.same(f"reused tensor, call {step}", t, want)
            c.same(f"reused tensor, call {step}: work.result()", w.result()[0], want)
            c.same(f"reused tensor, call {step}: future", w.get_future().wait()[0], want)
            if not (w.is_completed() and w.is_success() and w.wait() and w.exception() is None):
                c.failures.append(f"reused tensor, call {step}: work not complete")
        t.set_(data(torch.float32, 37, RANK, 1).untyped_storage())        # new memory
        want = want_sum(t)
        dist.all_reduce(t)
        c.same("reused tensor after set_", t, want)
        t.data = data(torch.float64, 37, RANK, 2)          # new dtype (and memory)
        want = want_sum(t)
        dist.all_reduce(t)
        c.same("reused tensor after .data of another dtype", t, want)
        t.as_strided_((18,), (2,))                         # the same memory, non-contiguous
        before = t.clone()
        want = want_sum(before)
        dist.all_reduce(t)
        c.same("reused tensor made non-contiguous", t, want)
        b = data(torch.int32, 9, RANK)
        for root in range(WORLD):
            b.copy_(data(torch.int32, 9, RANK, root))
            dist.broadcast(b, root)
            c.same(f"reused tensor broadcast root={root}", b, data(torch.int32, 9, root, root))
        g = data(torch.float32, 5, RANK).requires_grad_()   # a leaf that wants gradients
        with torch.no_grad():
            want = want_sum(g)
            dist.all_reduce(g)
        c.same("all_reduce of a leaf requiring grad", g.detach(), want)

    c.run("reused tensors / synchronous works", reused_tensor_checks)

    def reduce_checks():
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            for op in (R.SUM, R.MAX):
                root = WORLD - 1
                t = data(dtype, 1001, RANK)
                dist.reduce(t, root, op=op)
                s = data(dtype, 1001, RANK)
                dist.reduce(s, root, op=op, group=gloo)
                if RANK == root:
                    c.same(f"reduce {dtype} {op}", t, s, exact)
                else:
                    c.same(f"reduce {dtype} {op}: non-root input unchanged", t,
                           data(dtype, 1001, RANK))

    c.run("reduce", reduce_checks)

    def allgather_checks():
        for dtype in FLOATS + INTS:
            for n in (1, 4099):
                def f(g, n=n):
                    outs = [torch.full((n,), 99, dtype=dtype) for _ in range(WORLD)]
                    dist.all_gather(outs, data(dtype, n, RANK), group=g)
                    return torch.stack(outs)
                a, b = both(f)
                c.same(f"all_gather {dtype} n={n}", a, b)

                def h(g, n=n):
                    out = torch.empty(WORLD * n, dtype=dtype)
                    dist.all_gather_into_tensor(out, data(dtype, n, RANK), group=g)
                    return out
                a, b = both(h)
                c.same(f"all_gather_into_tensor {dtype} n={n}", a, b)
        out = torch.empty(WORLD, 3)
        dist.all_gather_into_tensor(out, torch.full((1, 3), float(RANK)), async_op=True).wait()
        c.same("all_gather_into_tensor async 2-d",
               out, torch.arange(WORLD, dtype=torch.float32).repeat_interleave(3).reshape(WORLD, 3))

    c.run("all_gather", allgather_checks)

    def reduce_scatter_checks():
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32):
            for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
                n = 1000
                def f(g, op=op):
                    out = torch.empty(n, dtype=dtype)
                    ins = [data(dtype, n, RANK, salt=i) for i in range(WORLD)]
                    dist.reduce_scatter(out, ins, op=op, group=g)
                    return out
                a, b = both(f)
                c.same(f"reduce_scatter {dtype} {op}", a, b, exact)

                def h(g, op=op):
                    out = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter_tensor(out, data(dtype, n * WORLD, RANK), op=op, group=g)
                    return out
                a, b = both(h)
                c.same(f"reduce_scatter_tensor {dtype} {op}", a, b, exact)
        out = torch.empty(10)
        dist.reduce_scatter_tensor(out, data(torch.float32, 10 * WORLD, RANK), op=R.AVG)
        s = torch.empty(10)
        dist.reduce_scatter_tensor(s, data(torch.float32, 10 * WORLD, RANK), group=gloo)
        c.same("reduce_scatter_tensor AVG", out, s / WORLD, exact=False)

    c.run("reduce_scatter", reduce_scatter_checks)

    def alltoall_checks():
        for dtype in (torch.float32, torch.int64, torch.bfloat16):
            # even
            def f(g):
                out = torch.empty(WORLD * 5, 3, dtype=dtype)
                dist.all_to_all_single(out, data(dtype, WORLD * 15, RANK).reshape(WORLD * 5, 3),
                                       group=g)
                return out
            a, b = both(f)
            c.same(f"all_to_all_single even {dtype}", a, b)
            # uneven: rank r sends (r + j) % 3 + (1 if j == 0 else 0) rows to rank j
            def rows(src: int, dst: int) -> int:
                return (src + dst) % 3 + (1 if dst == 0 else 0)

            in_splits = [rows(RANK, j) for j in range(WORLD)]
            out_splits = [rows(j, RANK) for j in range(WORLD)]

            def h(g):
                out = torch.full((sum(out_splits), 2), -1, dtype=dtype)
                inp = data(dtype, sum(in_splits) * 2, RANK).reshape(-1, 2)
                dist.all_to_all_single(out, inp, out_splits, in_splits, group=g)
                return out
            a, b = both(h)
            c.same(f"all_to_all_single uneven {dtype}", a, b)

            # the list form against the known answer (torch 2.11's Gloo has no all_to_all)
            ins = [data(dtype, 6, RANK, salt=j).reshape(2, 3) for j in range(WORLD)]
            outs = [torch.empty(2, 3, dtype=dtype) for j in range(WORLD)]
            dist.all_to_all(outs, ins)
            c.same(f"all_to_all list {dtype}", torch.stack(outs),
                   torch.stack([data(dtype, 6, j, salt=RANK).reshape(2, 3)
                                for j in range(WORLD)]))
            # uneven sizes per peer: vs the known answer
            ins = [data(dtype, rows(RANK, j) + 1, RANK, salt=j) for j in range(WORLD)]
            outs = [torch.empty(rows(j, RANK) + 1, dtype=dtype) for j in range(WORLD)]
            dist.all_to_all(outs, ins)
            for j in range(WORLD):
                c.same(f"all_to_all uneven list {dtype} from {j}", outs[j],
                       data(dtype, rows(j, RANK) + 1, j, salt=RANK))
        out = torch.empty(WORLD * 4)
        w = dist.all_to_all_single(out, data(torch.float32, WORLD * 4, RANK), async_op=True)
        w.wait()
        s = torch.empty(WORLD * 4)
        dist.all_to_all_single(s, data(torch.float32, WORLD * 4, RANK), group=gloo)
        c.same("all_to_all_single async", out, s)

    c.run("all_to_all", alltoall_checks)

    def gather_scatter_checks():
        for root in (0, WORLD - 1):
            for dtype in (torch.float32, torch.int8):
                def f(g):
                    outs = ([torch.empty(33, dtype=dtype) for _ in range(WORLD)]
                            if RANK == root else None)
                    dist.gather(data(dtype, 33, RANK), outs, dst=root, group=g)
                    return torch.stack(outs) if outs else torch.zeros(0)
                a, b = both(f)
                c.same(f"gather {dtype} root={root}", a, b)

                def h(g):
                    ins = ([data(dtype, 33, root, salt=i) for i in range(WORLD)]
                           if RANK == root else None)
                    out = torch.empty(33, dtype=dtype)
                    dist.scatter(out, ins, src=root, group=g)
                    return out
                a, b = both(h)
                c.same(f"scatter {dtype} root={root}", a, b)

    c.run("gather/scatter", gather_scatter_checks)

    def p2p_checks():
        nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
        for n in (5, 1 << 20):   # eager and rendezvous-sized messages
            send = data(torch.float32, n, RANK)
            recv = torch.empty(n)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, recv, prv),
                                           dist.P2POp(dist.isend, send, nxt)])
            for q in reqs:
                q.wait()
            c.same(f"batch_isend_irecv n={n}", recv, data(torch.float32, n, prv))
            # the same exchange with plain isend/irecv, sends issued first on every rank
            recv = torch.empty(n)
            a = dist.isend(send, nxt, tag=3)
            b = dist.irecv(recv, prv, tag=3)
            a.wait()
            b.wait()
            c.same(f"isend/irecv n={n}", recv, data(torch.float32, n, prv))
        if RANK == 0:
            dist.send(data(torch.int64, 10, 0), 1)
            t = torch.empty(10, dtype=torch.int64)
            dist.recv(t, 1)
            c.same("send/recv", t, data(torch.int64, 10, 1))
        elif RANK == 1:
            t = torch.empty(10, dtype=torch.int64)
            dist.recv(t, 0)
            c.same("recv/send", t, data(torch.int64, 10, 0))
            dist.send(data(torch.int64, 10, 1), 0)
        if WORLD == 2:  # recv without src: any source
            t = torch.empty(3)
            if RANK == 0:
                dist.send(torch.ones(3) * 5, 1, tag=9)
            else:
                src = dist.recv(t, tag=9)
                c.same("recv any source", t, torch.ones(3) * 5)
                if src != 0:
                    c.failures.append(f"recv any source returned src={src}")

    c.run("p2p", p2p_checks)

    def object_checks():
        objs = [None] * WORLD
        dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK})
        if objs != [{"rank": r, "s": "x" * r} for r in range(WORLD)]:
            c.failures.append(f"all_gather_object: {objs}")
        lst = [RANK, "a", {1: 2}] if RANK == 0 else [None, None, None]
        dist.broadcast_object_list(lst, src=0)
        if lst != [0, "a", {1: 2}]:
            c.failures.append(f"broadcast_object_list: {lst}")
        got = [None] * WORLD if RANK == WORLD - 1 else None
        dist.gather_object(("r", RANK), got, dst=WORLD - 1)
        if RANK == WORLD - 1 and got != [("r", r) for r in range(WORLD)]:
            c.failures.append(f"gather_object: {got}")
        out = [None]
        dist.scatter_object_list(out, [f"to{r}" for r in range(WORLD)] if RANK == 0 else None,
                                 src=0)
        if out != [f"to{RANK}"]:
            c.failures.append(f"scatter_object_list: {out}")
        c.checked += 4

    c.run("object collectives", object_checks)

    def group_checks():
        members = [0, WORLD - 1]
        sub = dist.new_group(members, backend="pycoll")
        if RANK in members:
            t = torch.full((8,), float(RANK + 1))
            dist.all_reduce(t, group=sub)
            c.same("new_group all_reduce", t, torch.full((8,), float(1 + WORLD)))
            c.checked += 1
            if dist.get_backend(sub) != "pycoll":
                c.failures.append(f"new_group backend {dist.get_backend(sub)}")
        dist.barrier()
        barrier(timeout=timedelta(seconds=30))
        dist.barrier(async_op=True).wait()

    c.run("new_group/barrier", group_checks)

    def coalesced_checks():
        import torch.distributed._functional_collectives as fc
        pg = dist.group.WORLD
        # the backend methods C++ (functional collectives, torch.compile) calls
        ts = [data(torch.float32, 10, RANK), data(torch.float64, 3, RANK)]
        ref = [t.clone() for t in ts]
        w = pg.allreduce_coalesced(ts, dist.AllreduceCoalescedOptions())
        w.wait()
        for i, r in enumerate(ref):
            dist.all_reduce(r, group=gloo)
            c.same(f"allreduce_coalesced[{i}]", ts[i], r)
        ins = [data(torch.float32, 4, RANK), data(torch.int32, 6, RANK)]
        outs = [torch.empty(4 * WORLD), torch.empty(6 * WORLD, dtype=torch.int32)]
        pg.allgather_into_tensor_coalesced(outs, ins,
                                           torch._C._distributed_c10d.AllgatherOptions()).wait()
        for i, (o, x) in enumerate(zip(outs, ins)):
            want = torch.empty_like(o)
            dist.all_gather_into_tensor(want, x, group=gloo)
            c.same(f"allgather_into_tensor_coalesced[{i}]", o, want)
        ins = [data(torch.float32, 4 * WORLD, RANK), data(torch.float64, 2 * WORLD, RANK)]
        outs = [torch.empty(4), torch.empty(2, dtype=torch.float64)]
        pg.reduce_scatter_tensor_coalesced(outs, ins, dist.ReduceScatterOptions()).wait()
        for i, (o, x) in enumerate(zip(outs, ins)):
            want = torch.empty_like(o)
            dist.reduce_scatter_tensor(want, x, group=gloo)
            c.same(f"reduce_scatter_tensor_coalesced[{i}]", o, want)
        # functional collectives (the ops torch.compile emits), eager
        x = data(torch.float32, 12, RANK)
        want = x.clone()
        dist.all_reduce(want, group=gloo)
        got = fc.all_reduce(x, "sum", pyc)
        got = got.wait() if hasattr(got, "wait") else got
        c.same("functional all_reduce", got, want)
        got = fc.all_gather_tensor(x, 0, pyc)
        got = got.wait() if hasattr(got, "wait") else got
        want = torch.empty(12 * WORLD)
        dist.all_gather_into_tensor(want, x, group=gloo)
        c.same("functional all_gather_tensor", got, want)
        got = fc.reduce_scatter_tensor(data(torch.float32, 4 * WORLD, RANK), "sum", 0, pyc)
        got = got.wait() if hasattr(got, "wait") else got
        want = torch.empty(4)
        dist.reduce_scatter_tensor(want, data(torch.float32, 4 * WORLD, RANK), group=gloo)
        c.same("functional reduce_scatter_tensor", got, want)
        got = fc.all_gather_into_tensor_coalesced([x, x * 2], pyc)
        got = [g.wait() if hasattr(g, "wait") else g for g in got]
        want = torch.empty(12 * WORLD)
        dist.all_gather_into_tensor(want, x * 2, group=gloo)
        c.same("functional all_gather_into_tensor_coalesced", got[1], want)
        got = fc.reduce_scatter_tensor_coalesced(
            [data(torch.float32, 2 * WORLD, RANK)], "sum", [0], pyc)
        got = [g.wait() if hasattr(g, "wait") else g for g in got]
        want = torch.empty(2)
        dist.reduce_scatter_tensor(want, data(torch.float32, 2 * WORLD, RANK), group=gloo)
        c.same("functional reduce_scatter_tensor_coalesced", got[0], want)
        got = fc.all_to_all_single(data(torch.float32, 2 * WORLD, RANK), None, None, pyc)
        got = got.wait() if hasattr(got, "wait") else got
        want = torch.empty(2 * WORLD)
        dist.all_to_all_single(want, data(torch.float32, 2 * WORLD, RANK), group=gloo)
        c.same("functional all_to_all_single", got, want)

    c.run("coalesced / functional", coalesced_checks)

    # errors surface as RuntimeError before any communication, and the group stays usable
    def invalid_checks():
        try:
            dist.all_reduce(torch.zeros(3, dtype=torch.float32), op=R.BAND)
            c.failures.append("BAND on float32 did not raise")
        except RuntimeError:
            pass
        t = torch.ones(2)
        dist.all_reduce(t)
        c.same("all_reduce after a refused call", t, torch.full((2,), float(WORLD)))

    c.run("invalid input", invalid_checks)

    # destroy_process_group releases pycoll's threads, shared memory and pidfds
    pg_comm = dist.group.WORLD.comm
    dist.destroy_process_group()
    time.sleep(0.2)
    leftovers = resources()
    if leftovers:
        c.failures.append(f"after destroy_process_group: {leftovers}")
    if any(pg_comm.open_channels().values()):
        c.failures.append("communicator still holds transports after destroy")
    return {"failures": c.failures, "checked": c.checked}
