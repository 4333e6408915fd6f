"""deterministic=True on the fast path's large allreduces: the chunked and the cross-memory
kernels fold in rank order (issue 29).

Every rank regenerates every rank's input (seeded by rank and case), so it checks its own
result against ``folding.reference`` bit for bit without shipping megabytes to the parent.
The same data without ``deterministic`` is reduced too: with three ranks its order (own
share first) gives other bits for some float sums, which is what shows the ordered result is
not the kernels' usual one by luck. (Two inputs fold alike in either order: x0 + x1 is
x1 + x0, bit for bit.)
"""
from __future__ import annotations

import numpy as np
import pytest
from test_fastpath import _outcome, _refuse_cross_memory_attach

from pycoll import fastpath
from pycoll.buffers.folding import reference
from pycoll.fastpath.calls import ALLREDUCE_CMA_BYTES, CHUNKED, DIRECT
from pycoll.testing import run_ranks

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not fastpath.probe_limit(),
                                 reason="the fast path needs numba on Linux x86-64/aarch64 "
                                        "(pip install numba)")]


def _input(rank: int, count: int, dtype: str, case: int) -> np.ndarray:
    """Mixed signs and exponents (2**-20 to 2**20): sums that round differently by order."""
    rng = np.random.default_rng([case, rank, count])
    if dtype.startswith("int"):
        return rng.integers(-(1 << 20), 1 << 20, count).astype(dtype)
    values = rng.standard_normal(count) * np.exp2(rng.integers(-20, 21, count))
    return values.astype(dtype)


def _cases(size: int) -> list[tuple[int, str, str]]:
    """(count, dtype, op): just above one slot (a second chunk of one element), several
    chunks with an uneven last one, and 4 MiB and more (the cross-memory kernel)."""
    limit = fastpath.agreed_limits([fastpath.probe_record()] * size, size)[0]
    cases = []
    for dtype in ("float32", "float64", "int32"):
        item = np.dtype(dtype).itemsize
        per = limit // item
        for count in (per + 1, 3 * per + 12345, ALLREDUCE_CMA_BYTES // item + 7):
            cases.append((count, dtype, "sum"))
    cases += [(2 * limit // 8 + 3, "float64", "avg"), (5 * limit // 4 + 1, "float32", "prod"),
              (ALLREDUCE_CMA_BYTES // 8 + 5, "float64", "prod")]
    return cases


def _ordered(comm, cases, direct_bytes):
    """Each case with deterministic=True (checked here against the reference, and that it
    took the fast path), then the same inputs without."""
    fast = comm._fast
    assert fast is not None, "a one-host shm communicator must have the fast path"
    if direct_bytes is not None:        # every rank alike: the kernel is in the signature
        fast.direct_bytes = direct_bytes
    out = []
    for i, (count, dtype, op) in enumerate(cases):
        inputs = [_input(r, count, dtype, i) for r in range(comm.size)]
        want = reference(inputs, op)
        x = inputs[comm.rank].copy()
        kind = comm.selected_algorithm("allreduce", x.nbytes)
        plan = comm.allreduce_init(x, op, deterministic=True)
        before = fast.k
        comm.allreduce(x, op, deterministic=True)
        took = fast.k - before
        y = inputs[comm.rank].copy()
        comm.allreduce(y, op, deterministic=False)
        out.append((kind, plan.path, took, np.array_equal(x, want), np.array_equal(y, want)))
    return out


@pytest.mark.parametrize("size", [2, 3])
def test_large_ordered_allreduces_fold_in_rank_order_on_the_fast_path(size):
    """With a core per rank the cross-memory kernel serves 4 MiB and more. Three ranks on
    a two-core host would stay in the slots there (a crowded host), so the test has them
    read each other's buffers from the same size as two ranks do."""
    cases = _cases(size)
    results = run_ranks(_ordered, size, cases, ALLREDUCE_CMA_BYTES, timeout=110)
    cma = fastpath.probe_record()["fast_cma"] > 0
    differs = []
    for i, (count, dtype, op) in enumerate(cases):
        nbytes = count * np.dtype(dtype).itemsize
        expected = DIRECT if cma and nbytes >= ALLREDUCE_CMA_BYTES else CHUNKED
        for rank, per_case in enumerate(results):
            kind, path, took, ordered_ok, _ = per_case[i]
            assert kind == path == expected, (count, dtype, op, rank, kind, path)
            assert took > 1, (count, dtype, op, rank, "did not take the fast path")
            assert ordered_ok, (count, dtype, op, rank, "not the rank-order fold")
        differs.append(not results[0][i][4])
    assert not any(d for (_, dtype, _), d in zip(cases, differs) if dtype == "int32")
    if size > 2:
        assert any(differs), "no case tells the rank order from the kernels' usual order"


def _refused(comm, cases, refuse_on):
    """The first case finds that one rank may not read the others' memory (seccomp) and
    completes through the slots, still in rank order; the later ones start there."""
    comm._fast.direct_bytes = 64 * 1024
    if comm.rank == refuse_on:
        _refuse_cross_memory_attach()
    out = []
    for i, (count, dtype, op) in enumerate(cases):
        inputs = [_input(r, count, dtype, i) for r in range(comm.size)]
        x = inputs[comm.rank].copy()
        kind = comm.selected_algorithm("allreduce", x.nbytes)
        comm.allreduce(x, op, deterministic=True)
        out.append((kind, np.array_equal(x, reference(inputs, op))))
    return out


def test_a_refused_cross_memory_read_keeps_the_rank_order():
    cases = [(300001, "float32", "sum"), (100003, "float64", "sum")]
    for per_case in run_ranks(_refused, 3, cases, 1, timeout=110):
        kinds = [kind for kind, _ in per_case]
        assert kinds == [DIRECT, CHUNKED], kinds
        assert all(ok for _, ok in per_case), per_case


def _disagree_about_the_order(comm):
    x = np.ones(300001, dtype=np.float32)
    return _outcome(lambda: comm.allreduce(x, deterministic=comm.rank == 0))


def test_ranks_that_disagree_about_the_order_raise_collective_mismatch():
    """One rank folds in rank order, the other not: another call, caught by the slots'
    signature at once."""
    for kind, message, elapsed in run_ranks(_disagree_about_the_order, 2,
                                            collective_timeout=20):
        assert kind == "CollectiveMismatch" and elapsed < 5, (kind, message)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_the_out_of_place_and_left_steps_keep_the_operands_order(dtype):
    """``combine_into`` (out = a op b) and ``combine_left`` (acc = src op acc) for every op:
    the ones the kernels fold in order (sum, prod) in one pass, the others through
    ``combine``; each equals ``combine`` on a copy of the left operand. NaNs in float inputs
    show which operand ``min``/``max`` keep."""
    from pycoll.fastpath import combine as C
    ops = [C.OP_SUM, C.OP_PROD, C.OP_MIN, C.OP_MAX]
    if dtype == "int32":
        ops += [C.OP_BAND, C.OP_BOR, C.OP_BXOR]
    a, b = (_input(r, 1001, dtype, 7) for r in (0, 1))
    if dtype == "float32":
        a[::7] = np.nan
        b[::5] = np.frombuffer(np.uint32(0x7FC00001).tobytes(), dtype=np.float32)[0]
    for op in ops:
        want = a.copy()
        C.combine(want, b, op)
        out = np.empty_like(a)
        C.combine_into(out, a, b, op)
        assert out.tobytes() == want.tobytes(), op
        acc, src = b.copy(), a.copy()
        C.combine_left(acc, src, op)
        assert acc.tobytes() == want.tobytes(), op
