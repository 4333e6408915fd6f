"""CUDA buffers end to end: every collective, op and dtype on torch CUDA tensors and CuPy
arrays, over cuda_ipc (device to device) and over shm and tcp (staged through host memory),
against the CPU reference computed by numpy in the same rank.

On a GPU with CuPy (pycoll's cuda12/cuda13 extra) with torch tensors and CuPy arrays;
elsewhere with the arrays of pycoll's CPU simulator of CUDA (conftest.py), which runs the
same code paths but is never a GPU run (the torch cases need a GPU and skip there). Ranks are
spawned, not forked: CUDA cannot be used in a child forked from a process that initialised it.
Several ranks share one GPU, as on a one-GPU machine (NCCL treats that case as peer to peer
too).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from pycoll.cuda import runtime
from pycoll.testing import run_ranks


def _needs_gpu():
    if os.environ.get("PYCOLL_CUDA_SIMULATOR", "").strip() not in ("", "0"):
        pytest.skip("torch CUDA tensors need a GPU (this run is on pycoll's CUDA simulator)")

OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
       "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
TRANSPORTS = ["cuda_ipc", "shm", "tcp"]


def _ops(dtype):
    if dtype.startswith(("int", "uint")):
        return list(OPS) + ["avg"]
    return ["sum", "prod", "min", "max", "avg"]


def _values(rank, n, dtype):
    """Small values every dtype holds exactly (products of 4 ranks included)."""
    base = (np.arange(n) % 2 + 1 + rank % 2).astype(np.float64)
    if dtype.startswith("uint") or dtype.startswith("int"):
        return base.astype(dtype)
    return base.astype(np.float32 if dtype == "bfloat16" else dtype)


def _device(kind, host, dtype):
    """A device buffer holding ``host`` (bfloat16 made by torch)."""
    if kind == "torch":
        import torch
        t = torch.from_numpy(np.ascontiguousarray(host)).cuda()
        return t.to(torch.bfloat16) if dtype == "bfloat16" else t
    if dtype == "bfloat16":
        return None       # CuPy has no bfloat16
    return runtime.cupy().asarray(host)


def _to_numpy(obj, dtype):
    if hasattr(obj, "cpu"):
        t = obj.float() if dtype == "bfloat16" else obj
        return t.cpu().numpy()
    return runtime.cupy().asnumpy(obj)


def _reference(op, dtype, inputs):
    """The CPU reference in float64 (int64 for the bitwise ops)."""
    if op in ("band", "bor", "bxor"):
        acc = inputs[0].astype(np.int64)
        for x in inputs[1:]:
            acc = OPS[op](acc, x.astype(np.int64))
        return acc.astype(np.float64)
    acc = inputs[0].astype(np.float64)
    for x in inputs[1:]:
        acc = OPS["sum" if op == "avg" else op](acc, x.astype(np.float64))
    if op == "avg":
        acc = acc / len(inputs)
        if dtype.startswith(("int", "uint")):
            acc = np.trunc(acc)
    return acc


def _every_collective(comm, kind):
    if kind == "torch":
        import torch
        torch.cuda.set_device(0)
    failures, checked = [], 0
    n, size, rank = 37, comm.size, comm.rank
    for dtype in DTYPES:
        inputs = [_values(r, n, dtype) for r in range(size)]
        if _device(kind, inputs[rank], dtype) is None:
            continue
        for op in _ops(dtype):
            t = _device(kind, inputs[rank], dtype)
            comm.allreduce(t, op)
            want = _reference(op, dtype, inputs)
            got = _to_numpy(t, dtype).astype(np.float64)
            tol = 1e-2 if dtype in ("float16", "bfloat16") else 1e-6
            if not np.allclose(got, want, rtol=tol):
                failures.append(f"allreduce {op} {dtype}: {got[:4]} != {want[:4]}")
            checked += 1
        t = _device(kind, inputs[rank], dtype)
        comm.broadcast(t, root=size - 1)
        if not np.array_equal(_to_numpy(t, dtype).astype(np.float64),
                              inputs[size - 1].astype(np.float64)):
            failures.append(f"broadcast {dtype}")
        t = _device(kind, inputs[rank], dtype)
        comm.reduce(t, root=0, op="sum")
        if rank == 0 and not np.allclose(_to_numpy(t, dtype).astype(np.float64),
                                         _reference("sum", dtype, inputs), rtol=1e-2):
            failures.append(f"reduce {dtype}")
        out = _device(kind, np.zeros(n * size, dtype=inputs[0].dtype), dtype)
        comm.allgather(out, _device(kind, inputs[rank], dtype))
        if not np.array_equal(_to_numpy(out, dtype).astype(np.float64),
                              np.concatenate(inputs).astype(np.float64)):
            failures.append(f"allgather {dtype}")
        full = [_values(r, n * size, dtype) for r in range(size)]
        out = _device(kind, np.zeros(n, dtype=inputs[0].dtype), dtype)
        comm.reduce_scatter(out, _device(kind, full[rank], dtype))
        want = _reference("sum", dtype, full)[rank * n:(rank + 1) * n]
        if not np.allclose(_to_numpy(out, dtype).astype(np.float64), want, rtol=1e-2):
            failures.append(f"reduce_scatter {dtype}")
        src = _device(kind, np.repeat(np.arange(size), n).astype(inputs[0].dtype) + rank, dtype)
        out = _device(kind, np.zeros(n * size, dtype=inputs[0].dtype), dtype)
        comm.alltoall(out, src)
        want = np.repeat(np.full(size, rank), n) + np.repeat(np.arange(size), n)
        if not np.array_equal(_to_numpy(out, dtype).astype(np.float64), want):
            failures.append(f"alltoall {dtype}")
        checked += 5
        if size >= 2:
            buf = _device(kind, inputs[rank], dtype)
            if rank == 0:
                comm.send(buf, 1, tag=3)
            elif rank == 1:
                comm.recv(buf, 0, tag=3)
                if not np.array_equal(_to_numpy(buf, dtype), _to_numpy(
                        _device(kind, inputs[0], dtype), dtype)):
                    failures.append(f"send/recv {dtype}")
    comm.barrier()
    return failures, checked, comm.transport_summary()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("kind", ["torch", "cupy"])
def test_every_collective_op_dtype_against_the_cpu_reference(kind, world_size, transport):
    if kind == "torch":
        _needs_gpu()
        pytest.importorskip("torch")
    results = run_ranks(_every_collective, world_size, kind, timeout=540,
                        env={"PYCOLL_TRANSPORTS": transport}, start_method="spawn")
    for rank, (failures, checked, summary) in enumerate(results):
        assert not failures, (rank, failures)
        assert checked > 40
        assert transport in summary, summary


def _stream_order(comm):
    """The collective waits for work queued on the caller's stream, and its result is
    ordered before work the caller queues after it (no host synchronisation in between)."""
    import torch
    torch.cuda.set_device(0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros(1 << 22, device="cuda")
        torch.cuda._sleep(50_000_000)          # ~tens of ms of GPU time before the fill
        x.fill_(comm.rank + 1)
        comm.allreduce(x)                       # must see the fill, not the zeros
        y = x * 2                               # queued after the collective on `side`
        work = comm.allreduce(x, async_op=True)
    work.wait()
    side.synchronize()
    total = sum(range(1, comm.size + 1))
    return float(y[0].item()), float(y[-1].item()), float(x[0].item()), total


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["cuda_ipc", "shm"])
def test_stream_semantics(transport):
    _needs_gpu()
    for first, last, again, total in run_ranks(_stream_order, 2, timeout=240,
                                               env={"PYCOLL_TRANSPORTS": transport},
                                               start_method="spawn"):
        assert first == last == 2 * total
        assert again == total * 2       # the second allreduce summed the first's result


def _variants_on_device(comm):
    """out= (the device copy, direct and staged), reduce_scatter_v, gatherv and scatterv
    on CuPy arrays, against numpy; out in host memory for a device tensor is refused."""
    cp = runtime.cupy()
    p, me, n = comm.size, comm.rank, 37
    failures = []
    inputs = [np.arange(n, dtype=np.float32) + 10 * r for r in range(p)]
    t, o = cp.asarray(inputs[me]), cp.zeros(n, dtype=cp.float32)
    comm.allreduce(t, out=o)
    if not (np.array_equal(cp.asnumpy(o), sum(inputs))
            and np.array_equal(cp.asnumpy(t), inputs[me])):
        failures.append("allreduce out")
    o = cp.zeros(n, dtype=cp.float32)
    comm.reduce(t, p - 1, out=o)
    if me == p - 1 and not np.array_equal(cp.asnumpy(o), sum(inputs)):
        failures.append("reduce out")
    o = cp.zeros(n, dtype=cp.float32)
    comm.broadcast(t, 0, out=o)
    if not (np.array_equal(cp.asnumpy(o), inputs[0])
            and np.array_equal(cp.asnumpy(t), inputs[me])):
        failures.append("broadcast out")
    try:
        comm.allreduce(t, out=np.zeros(n, np.float32))
        failures.append("host out for a device tensor accepted")
    except ValueError as e:
        if "memory" not in str(e):
            failures.append(f"host out: {e}")
    counts = [0] + [r + 2 for r in range(1, p)]
    total = sum(counts)
    starts = np.cumsum([0] + counts)
    full = [np.arange(total, dtype=np.float32) * (r + 1) for r in range(p)]
    out = cp.asarray(np.full(counts[me], -1, np.float32))
    comm.reduce_scatter_v(out, cp.asarray(full[me]), counts)
    if not np.array_equal(cp.asnumpy(out), sum(full)[starts[me]:starts[me + 1]]):
        failures.append("reduce_scatter_v")
    g = cp.asarray(np.full(total, -1, np.float32)) if me == 0 else None
    comm.gatherv(g, cp.asarray(full[me][starts[me]:starts[me + 1]]), counts, 0)
    if me == 0 and not np.array_equal(cp.asnumpy(g), np.concatenate(
            [full[r][starts[r]:starts[r + 1]] for r in range(p)])):
        failures.append("gatherv")
    part = cp.asarray(np.full(counts[me], -1, np.float32))
    comm.scatterv(part, cp.asarray(full[0]) if me == 0 else None, counts, 0)
    if not np.array_equal(cp.asnumpy(part), full[0][starts[me]:starts[me + 1]]):
        failures.append("scatterv")
    return failures


@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["cuda_ipc", "tcp"])
def test_out_of_place_and_uneven_variants_on_device(transport):
    for rank, failures in enumerate(run_ranks(_variants_on_device, 3, timeout=240,
                                              env={"PYCOLL_TRANSPORTS": transport},
                                              start_method="spawn")):
        assert not failures, (rank, failures)
