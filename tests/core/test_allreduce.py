"""Allreduce correctness against a numpy reference, in real rank processes."""
from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks

INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
OPS = ["sum", "prod", "min", "max", "avg"]


def _input(rank: int, count: int, dtype: str) -> np.ndarray:
    """Small values so that sums and products of a few ranks stay exact in every dtype."""
    base = (np.arange(count) * 7 + rank * 3) % 5 + 1
    if dtype.startswith("int"):
        base = base - 2          # negatives too (avg must truncate toward zero)
    return base.astype(dtype)


def _reference(size: int, count: int, dtype: str, op: str) -> np.ndarray:
    inputs = [_input(r, count, dtype).astype(np.float64) for r in range(size)]
    if op in ("sum", "avg"):
        out = np.sum(inputs, axis=0)
        if op == "avg":
            out = out / size
            if not dtype.startswith("float"):
                out = np.trunc(out)
    elif op == "prod":
        out = np.prod(inputs, axis=0)
    elif op == "min":
        out = np.min(inputs, axis=0)
    else:
        out = np.max(inputs, axis=0)
    return out


def _allreduce_cases(comm, cases):
    results = []
    for count, dtype, op, algo in cases:
        a = _input(comm.rank, count, dtype)
        comm.allreduce(a, op, algo=algo)
        results.append(a.tobytes())
    return results


def _check(size, cases, env=None):
    per_rank = run_ranks(_allreduce_cases, size, cases, env=env)
    for i, (count, dtype, op, _algo) in enumerate(cases):
        expected = _reference(size, count, dtype, op)
        for rank in range(size):
            got = np.frombuffer(per_rank[rank][i], dtype=dtype)
            assert got.tobytes() == per_rank[0][i], f"ranks disagree: {cases[i]}"
            if dtype.startswith("float"):
                tol = 1e-2 if dtype == "float16" else 1e-6
                np.testing.assert_allclose(got.astype(np.float64), expected, rtol=tol,
                                           err_msg=str(cases[i]))
            else:
                assert np.array_equal(got, expected.astype(dtype)), (cases[i], got[:8],
                                                                     expected[:8])


COUNTS = [0, 1, 2, 13, 1031]          # zero, one, tiny, prime, prime not divisible by size


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("algo", ["ring", "recursive_doubling"])
def test_every_op_and_dtype(size, algo):
    cases = [(count, dtype, op, algo)
             for dtype in INT_DTYPES + FLOAT_DTYPES
             for op in OPS
             for count in (COUNTS if dtype in ("int32", "float32") else [13])]
    _check(size, cases)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_pipelined_segments(size, transport):
    """A tiny segment size forces many segments per chunk through the pipelining path."""
    cases = [(count, "float32", "sum", "ring") for count in (1, 97, 10_007, 300_001)]
    cases += [(100_003, "int64", "max", "ring"), (5_003, "float64", "avg", None)]
    _check(size, cases, env={"PYCOLL_TRANSPORTS": transport, "PYCOLL_SEGMENT_BYTES": "4096"})


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_large_and_auto_selection(transport):
    cases = [(n, "float32", "sum", None) for n in (3, 20_000, 5_000_001)]
    _check(4, cases, env={"PYCOLL_TRANSPORTS": transport})


def test_shm_fragment_path_without_cma():
    cases = [(n, "float64", "sum", "ring") for n in (1, 50_000, 1_000_003)]
    _check(3, cases, env={"PYCOLL_SHM_CMA": "0"})


def _bool_and_premul(comm):
    b = np.array([comm.rank == 0, False, True])
    comm.allreduce(b, "max")
    f = np.full(4, comm.rank + 1.0, dtype=np.float32)
    comm.allreduce(f, pycoll.ReduceOp("premul_sum", 0.5))
    i = np.array([comm.rank + 1, 6], dtype=np.int32)
    comm.allreduce(i, "bxor")
    return b.tolist(), f.tolist(), i.tolist()


def test_bool_premul_and_bitwise():
    for b, f, i in run_ranks(_bool_and_premul, 3):
        assert b == [True, False, True]
        assert f == [3.0] * 4                     # 0.5 * (1 + 2 + 3)
        assert i == [1 ^ 2 ^ 3, 6 ^ 6 ^ 6]


def _torch_tensors(comm):
    import torch
    results = []
    for dtype in (torch.float32, torch.float64, torch.int64, torch.float16, torch.bfloat16):
        t = torch.arange(1, 1001, dtype=torch.float32).reshape(10, 100).to(dtype) * (comm.rank + 1)
        ptr = t.data_ptr()
        comm.allreduce(t, "sum")
        assert t.data_ptr() == ptr           # in place, zero copy
        results.append(t.float().flatten()[:5].tolist() + [float(t.float().sum())])
    return results


def test_torch_cpu_tensors():
    pytest.importorskip("torch")
    import torch
    results = run_ranks(_torch_tensors, 2)
    assert results[0] == results[1]
    for dtype, row in zip(("f32", "f64", "i64", "f16", "bf16"), results[0]):
        expected = torch.arange(1, 6, dtype=torch.float32) * 3
        assert row[:5] == pytest.approx(expected.tolist(), rel=1e-2), dtype


def _torch_parallel_sum(comm):
    import torch
    t = torch.ones(1 << 20) * (comm.rank + 1)     # large enough for a parallel region
    s = torch.full((4,), float(t.sum()))
    comm.allreduce(s, "sum")
    return s.tolist()


def test_ranks_forked_after_torch_ran_on_threads_can_use_torch():
    """This process runs a torch op on two threads, which starts GNU OpenMP's thread pool;
    a rank forked afterwards inherits a pool whose threads it does not have, and its first
    parallel torch op waited for them for ever. run_ranks runs the forked ranks' torch on
    one thread."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert float(torch.ones(1 << 20).sum()) == 1 << 20       # the pool starts here
        out = run_ranks(_torch_parallel_sum, 2, timeout=30)
    finally:
        torch.set_num_threads(threads)
    assert out == [[3.0 * (1 << 20)] * 4] * 2


def _async_ops(comm):
    arrays = [np.full(1000, comm.rank + i, dtype=np.float64) for i in range(5)]
    works = [comm.allreduce(a, async_op=True) for a in arrays]
    for w in works:
        w.wait(timeout=30)
        assert w.is_completed() and w.exception() is None
    comm.barrier()
    return [a[0] for a in arrays]


def test_async_ops_complete_in_order():
    for values in run_ranks(_async_ops, 3):
        assert values == [3.0 + 3 * i for i in range(5)]


def _world_of_one_module_api(comm):
    a = np.arange(5, dtype=np.float32)
    pycoll.allreduce(a, "avg")
    return pycoll.get_rank(), pycoll.get_world_size(), a.tolist()


def test_module_level_api_world_of_one():
    assert run_ranks(_world_of_one_module_api, 1) == [(0, 1, [0.0, 1.0, 2.0, 3.0, 4.0])]


def _bad_inputs(comm):
    messages = {}
    cases = {
        "unknown op": lambda: comm.allreduce(np.zeros(4), "median"),
        "non-contiguous": lambda: comm.allreduce(np.zeros((4, 4))[:, 1]),
        "read-only": lambda: comm.allreduce(np.frombuffer(b"\0" * 16, dtype=np.float32)),
        "complex max": lambda: comm.allreduce(np.zeros(4, dtype=np.complex64), "max"),
        "object dtype": lambda: comm.allreduce(np.zeros(4, dtype=object)),
        "bitwise on float": lambda: comm.allreduce(np.zeros(4), "band"),
        "not an array": lambda: comm.allreduce([1.0, 2.0]),
        "unknown algorithm": lambda: comm.allreduce(np.zeros(4), algo="magic"),
    }
    for name, call in cases.items():
        try:
            call()
        except (ValueError, TypeError) as e:
            messages[name] = f"{type(e).__name__}: {e}"
    # The communicator is still healthy: nothing was sent.
    a = np.ones(3)
    comm.allreduce(a)
    messages["after"] = a.tolist()
    return messages


def test_invalid_input_raises_before_communication():
    for messages in run_ranks(_bad_inputs, 2):
        assert messages.pop("after") == [2.0, 2.0, 2.0]
        assert len(messages) == 8, messages
        assert "median" in messages["unknown op"] and "valid ops" in messages["unknown op"]
        assert "contiguous" in messages["non-contiguous"]
        assert "read-only" in messages["read-only"]
        assert "complex" in messages["complex max"] and "no order" in messages["complex max"]
        assert "band" in messages["bitwise on float"]
        assert "magic" in messages["unknown algorithm"]


def _mismatched_sizes(comm):
    a = np.ones(1000 + comm.rank * 10, dtype=np.float32)
    comm.allreduce(a, algo="ring")


def test_mismatched_sizes_raise_instead_of_hanging():
    outcomes = run_ranks(_mismatched_sizes, 2, expect_failure=True, collective_timeout=20)
    kinds = {kind for kind, _ in outcomes}
    # The element count is in every message's signature: a CollectiveMismatch, before any
    # size comparison. The peer of the rank that saw it may learn through the abort record.
    assert kinds <= {"CollectiveMismatch", "MessageSizeMismatch", "PeerLost", "Aborted"}, outcomes
    assert "CollectiveMismatch" in kinds
    text = " ".join(tb for _, tb in outcomes)
    assert "allreduce #1" in text


def _raising_callback(comm):
    a = np.ones(1000)
    w = comm.allreduce(a, async_op=True)
    w.add_done_callback(lambda _: 1 / 0)          # a user's bug must not kill the worker
    w.wait(timeout=30)
    later = [comm.allreduce(np.ones(10), async_op=True) for _ in range(3)]
    for x in later:
        x.wait(timeout=30)
    b = np.ones(3)
    comm.allreduce(b)
    return float(a[0]), float(b[0])


def test_raising_done_callback_does_not_stop_the_communicator():
    assert run_ranks(_raising_callback, 2) == [(2.0, 2.0)] * 2


def _complex(comm):
    r = comm.rank
    out = []
    for dtype in (np.complex64, np.complex128):
        for op in ("sum", "avg", "prod"):
            a = (np.arange(1, 6) + 1j * (r + 1)).astype(dtype)
            comm.allreduce(a, op)
            out.append(a.tolist())
        p = np.full(3, 2 - 1j * r, dtype=dtype)
        import pycoll as _p
        comm.allreduce(p, _p.ReduceOp.premul_sum(0.5))
        out.append(p.tolist())
    return out


def test_complex_sum_avg_prod_premul():
    size = 3
    results = run_ranks(_complex, size)
    ins = [np.arange(1, 6) + 1j * (r + 1) for r in range(size)]
    want = [np.sum(ins, axis=0), np.sum(ins, axis=0) / size, np.prod(ins, axis=0),
            0.5 * sum(np.full(3, 2 - 1j * r) for r in range(size))]
    for res in results:
        assert res == results[0]
        for got, w in zip(res, want + want):
            np.testing.assert_allclose(np.array(got), w, rtol=1e-6)


def _futures(comm):
    import asyncio

    a = np.full(4, comm.rank + 1.0)
    fut = comm.allreduce(a, async_op=True).get_future()
    assert fut.result(30) is a and a.tolist() == [3.0] * 4
    done = []
    fut.add_done_callback(lambda f: done.append(f.result() is a))  # already done: runs now
    w = comm.broadcast(np.zeros(2), 0, async_op=True)

    async def awaited():
        return await asyncio.wrap_future(w.get_future())
    asyncio.run(awaited())
    assert w.get_future() is w.get_future()
    bad = comm.allreduce(np.zeros(3) if comm.rank else np.zeros(4), async_op=True,
                         timeout=5).get_future()
    error = bad.exception(30)
    return done, type(error).__name__


def test_core_work_get_future():
    for done, error in run_ranks(_futures, 2):
        assert done == [True]
        assert error in ("MessageSizeMismatch", "CollectiveMismatch", "PeerLost", "Aborted"), error
