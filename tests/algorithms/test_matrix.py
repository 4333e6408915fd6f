"""The algorithm matrix: every collective x every algorithm, in real rank processes.

World sizes 1, 2, 3, 4, 5, 8 (powers of two and not) x element counts 0, 1, primes and
counts not divisible by the world size x every dtype and op x in-place / out-of-place / list
forms, on shm and tcp, with tiny segment sizes in part of it so the pipelined paths run.
Every case is checked inside the rank against a numpy reference (exact for integers and for
the small-integer float data, a tolerance where a float division is involved), and where all
ranks get the result the ranks' bytes must be identical.

Process start-up dominates, so each test batches hundreds of cases into one ``run_ranks``.
The multi-MiB combinations are marked ``slow``; a deterministic sample of them runs by
default and ``PYCOLL_TEST_FULL=1`` runs all of them.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import pytest

import pycoll
from pycoll.algorithms import ALGORITHMS
from pycoll.testing import run_ranks

#: the algorithms a call without compress= may force (the compressed ones need compress=;
#: tests/algorithms/test_compression.py runs them)
PLAIN = {coll: [name for name, a in table.items() if not a.compressed]
         for coll, table in ALGORITHMS.items()}

INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]
OPS_FOR = {
    **{d: ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"] for d in INT_DTYPES},
    **{d: ["sum", "prod", "min", "max", "avg", "premul_sum"] for d in FLOAT_DTYPES},
    "bool": ["sum", "prod", "min", "max", "band", "bor", "bxor"],
}
REDUCING = ("allreduce", "reduce", "reduce_scatter")
MOVING = ("broadcast", "allgather", "gather", "scatter", "alltoall")
REDUCE_AND_MOVE = REDUCING + MOVING
FORMS = {  # forms each collective accepts besides plain in-place / out-of-place
    "allreduce": ["inplace"], "reduce": ["inplace"], "broadcast": ["inplace"],
    "allgather": ["out", "list", "inplace"], "reduce_scatter": ["out", "list", "inplace"],
    "gather": ["out", "list", "inplace"], "scatter": ["out", "list", "inplace"],
    "alltoall": ["out"],   # in-place alltoall is not part of the API
    "barrier": ["inplace"],
}
PREMUL = 0.5
FULL = os.environ.get("PYCOLL_TEST_FULL") == "1"

Case = tuple[str, str, int, str, str, str, int]   # coll, algo, count, dtype, op, form, root


# -- data and reference (identical code in the ranks and the parent) -----------------------
def _values(rank: int, count: int, dtype: str, op: str, salt: int) -> np.ndarray:
    """Small integers (exact in every dtype) that differ by rank, position and case."""
    idx = np.arange(count, dtype=np.int64)
    if dtype == "bool":
        return ((idx * 7 + rank * 5 + salt) % 3 == 0)
    if op == "prod":
        base = (idx * 7 + rank * 3 + salt) % 2 + 1           # 1..2: 2**8 fits everywhere
    else:
        base = (idx * 7 + rank * 13 + salt) % 11              # 0..10
        if dtype.startswith("int"):
            base -= 5                                          # negatives: avg truncation
    return base.astype(dtype)


def _op(op: str) -> Any:
    return pycoll.ReduceOp("premul_sum", PREMUL) if op == "premul_sum" else op


_UFUNC = {"sum": np.add, "avg": np.add, "premul_sum": np.add, "prod": np.multiply,
          "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
          "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def _reduced(n: int, count: int, dtype: str, op: str, salt: int) -> np.ndarray:
    """The reduction of every rank's input, computed the plain way, in the same dtype."""
    inputs = [_values(r, count, dtype, op, salt) for r in range(n)]
    if op == "premul_sum":
        inputs = [x * np.asarray(PREMUL, dtype=dtype) for x in inputs]
    acc = inputs[0].copy()
    for x in inputs[1:]:
        _UFUNC[op](acc, x, out=acc)
    if op == "avg" and n > 1:
        if dtype.startswith("float"):
            return (acc.astype(np.float64) / n).astype(dtype)
        return np.trunc(acc.astype(np.float64) / n).astype(dtype)
    return acc


def _close(got: np.ndarray, want: np.ndarray, dtype: str, op: str) -> bool:
    if got.shape != want.shape:
        return False
    if dtype.startswith("float") and op in ("avg", "premul_sum"):
        tol = 1e-2 if dtype == "float16" else 1e-6
        return bool(np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                atol=tol))
    return got.tobytes() == want.tobytes()


# -- one case inside a rank --------------------------------------------------------------------
def _run_case(comm: Any, case: Case, salt: int) -> tuple[str | None, str | None]:
    """Run one case; return (error text or None, digest of the result where all ranks get one)."""
    coll, algo, count, dtype, op, form, root = case
    n, r = comm.size, comm.rank
    algo_arg = None if algo == "auto" else algo
    digest = None
    if coll == "barrier":
        comm.barrier()
        return None, None
    if coll == "allreduce":
        a = _values(r, count, dtype, op, salt)
        comm.allreduce(a, _op(op), algo=algo_arg)
        got, want, digest = a, _reduced(n, count, dtype, op, salt), a.tobytes()
    elif coll == "reduce":
        a = _values(r, count, dtype, op, salt)
        comm.reduce(a, root, _op(op), algo=algo_arg)
        if r != root:
            return None, None
        got, want = a, _reduced(n, count, dtype, op, salt)
    elif coll == "broadcast":
        a = _values(r, count, dtype, op, salt)
        comm.broadcast(a, root, algo=algo_arg)
        got, want, digest = a, _values(root, count, dtype, op, salt), a.tobytes()
    elif coll == "reduce_scatter":
        inp = _values(r, n * count, dtype, op, salt)
        if form == "list":
            out = np.full(count, 7, dtype=dtype)
            comm.reduce_scatter(out, [inp[i * count:(i + 1) * count] for i in range(n)],
                                _op(op), algo=algo_arg)
        elif form == "inplace":
            out = inp[r * count:(r + 1) * count]
            comm.reduce_scatter(out, inp, _op(op), algo=algo_arg)
        else:
            out = np.full(count, 7, dtype=dtype)
            comm.reduce_scatter(out, inp, _op(op), algo=algo_arg)
            if not np.array_equal(inp, _values(r, n * count, dtype, op, salt)):
                return "out-of-place reduce_scatter modified its input", None
        got = out
        want = _reduced(n, n * count, dtype, op, salt)[r * count:(r + 1) * count]
    elif coll == "allgather":
        blocks = [_values(i, count, dtype, op, salt) for i in range(n)]
        out = np.full(n * count, 7, dtype=dtype)
        if form == "list":
            outs = [np.full(count, 7, dtype=dtype) for _ in range(n)]
            comm.allgather(outs, blocks[r], algo=algo_arg)
            out = np.concatenate(outs) if outs else out
        elif form == "inplace":
            out[r * count:(r + 1) * count] = blocks[r]
            comm.allgather(out, out[r * count:(r + 1) * count], algo=algo_arg)
        else:
            comm.allgather(out, blocks[r], algo=algo_arg)
        got, want, digest = out, np.concatenate(blocks), out.tobytes()
    elif coll == "gather":
        blocks = [_values(i, count, dtype, op, salt) for i in range(n)]
        out = np.full(n * count, 7, dtype=dtype) if r == root else None
        if form == "list" and r == root:
            outs = [np.full(count, 7, dtype=dtype) for _ in range(n)]
            comm.gather(outs, blocks[r], root, algo=algo_arg)
            out = np.concatenate(outs)
        elif form == "inplace" and r == root:
            out[r * count:(r + 1) * count] = blocks[r]  # type: ignore[index]
            comm.gather(out, out[r * count:(r + 1) * count], root,  # type: ignore[index]
                        algo=algo_arg)
        else:
            comm.gather(out, blocks[r], root, algo=algo_arg)
        if r != root:
            return None, None
        got, want = out, np.concatenate(blocks)
    elif coll == "scatter":
        full = _values(root, n * count, dtype, op, salt)
        out = np.full(count, 7, dtype=dtype)
        if r != root:
            comm.scatter(out, None, root, algo=algo_arg)
        elif form == "list":
            comm.scatter(out, [full[i * count:(i + 1) * count] for i in range(n)], root,
                         algo=algo_arg)
        elif form == "inplace":
            out = full[r * count:(r + 1) * count]
            comm.scatter(out, full, root, algo=algo_arg)
        else:
            comm.scatter(out, full, root, algo=algo_arg)
        got, want = out, _values(root, n * count, dtype, op, salt)[r * count:(r + 1) * count]
    elif coll == "alltoall":
        inp = _values(r, n * count, dtype, op, salt)
        out = np.full(n * count, 7, dtype=dtype)
        comm.alltoall(out, inp, algo=algo_arg)
        got = out
        want = np.concatenate([_values(j, n * count, dtype, op, salt)[r * count:(r + 1) * count]
                               for j in range(n)])
    else:
        raise AssertionError(coll)
    if not _close(np.asarray(got), want, dtype, op):
        bad = np.flatnonzero(np.asarray(got) != want)[:5] if got.shape == want.shape else []
        return (f"rank {r}: wrong result at {list(bad)}: got {np.asarray(got)[:8]} "
                f"want {want[:8]}"), None
    return None, (hashlib.sha1(digest).hexdigest() if digest is not None else None)


def _run_cases(comm: Any, cases: list[Case]) -> list[tuple[str | None, str | None]]:
    return [_run_case(comm, case, salt=i) for i, case in enumerate(cases)]


def _check(n: int, cases: list[Case], env: dict[str, str] | None = None,
           timeout: float = 110.0) -> None:
    per_rank = run_ranks(_run_cases, n, cases, env=env, timeout=timeout,
                         collective_timeout=60.0)
    failures = []
    for i, case in enumerate(cases):
        errors = [per_rank[r][i][0] for r in range(n) if per_rank[r][i][0]]
        digests = {per_rank[r][i][1] for r in range(n)}
        if errors:
            failures.append(f"{case}: {errors[0]}")
        elif len(digests) > 1:
            failures.append(f"{case}: ranks hold different bytes")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(
        failures[:30])


# -- case lists ---------------------------------------------------------------------------------
def _algos(coll: str) -> list[str]:
    return PLAIN[coll] + ["auto"]


def _dtype_op_cases(n: int) -> list[Case]:
    """Every (dtype, op) pair, and every reducing algorithm with every dtype (count 13).

    The algorithms are dtype-blind except through the item size and the reduction they are
    handed, so the full dtype x op x algorithm cross would mostly repeat itself: each pair
    runs once per world size on an algorithm chosen in rotation (shifted by the world size,
    so over the matrix each algorithm meets many pairs), and each algorithm runs every dtype.
    """
    algos = [(coll, algo) for coll in REDUCING for algo in _algos(coll)]
    pairs = [(dtype, op) for dtype, ops in OPS_FOR.items() for op in ops]
    cases: list[Case] = []
    for i, (dtype, op) in enumerate(pairs):
        coll, algo = algos[(i + n) % len(algos)]
        cases.append((coll, algo, 13, dtype, op, FORMS[coll][0], i % n))
    for j, (coll, algo) in enumerate(algos):
        for k, (dtype, ops) in enumerate(OPS_FOR.items()):
            cases.append((coll, algo, 13, dtype, ops[(j + k) % len(ops)], FORMS[coll][0],
                          (j + k) % n))
    return cases


def _count_cases(n: int, counts: list[int], variants: list[tuple[str, str]],
                 colls: tuple[str, ...] = REDUCE_AND_MOVE) -> list[Case]:
    """Every algorithm x form x count; (dtype, op) and root rotate from case to case."""
    cases: list[Case] = []
    for coll in colls:
        for algo in _algos(coll):
            for form in FORMS[coll]:
                for count in counts:
                    dtype, op = variants[len(cases) % len(variants)]
                    if coll not in REDUCING:
                        op = "sum"
                    cases.append((coll, algo, count, dtype, op, form, len(cases) % n))
    return cases


def _counts(n: int) -> list[int]:
    """0, 1, primes and counts not divisible by the world size (or by its power of two)."""
    return [0, 1, 2, n - 1 if n > 2 else 3, 97, 1031 if n != 1031 else 1033]


SIZES = [1, 2, 3, 4, 5, 8]


@pytest.mark.parametrize("n", SIZES)
def test_dtypes_and_ops(n):
    _check(n, _dtype_op_cases(n) + [("barrier", "dissemination", 0, "int8", "sum", "inplace", 0)])


@pytest.mark.parametrize("n", SIZES)
def test_counts_and_forms(n):
    cases = _count_cases(n, _counts(n), [("int32", "sum"), ("float64", "max"),
                                          ("float32", "avg"), ("int64", "bxor")])
    cases += _count_cases(n, [n * 5 + 3], [("uint8", "prod"), ("float16", "min"),
                                           ("bool", "bor")])
    _check(n, cases)


@pytest.mark.parametrize("n,transport,segment", [
    (2, "shm", 64), (3, "shm", 64), (4, "shm", 64), (5, "shm", 4096), (8, "shm", 4096),
    (2, "tcp", 4096), (3, "tcp", 64), (5, "tcp", 4096),
])
def test_tiny_segments(n, transport, segment):
    """Tiny segments: many per chunk, so every pipelined path (ring, chain, recv-reduce) runs."""
    cases = _count_cases(n, [1, 97, 1031, 20_011], [("float32", "sum"), ("int16", "max")])
    cases += _count_cases(n, [4099], [("float64", "avg"), ("uint8", "sum")], REDUCING)
    _check(n, cases, env={"PYCOLL_TRANSPORTS": transport, "PYCOLL_SEGMENT_BYTES": str(segment)})


# The largest combinations: a few MiB per case, every algorithm, both transports. A fixed
# sample (every third, by position) runs by default; PYCOLL_TEST_FULL=1 runs them all.
_LARGE = [(n, transport) for transport in ("shm", "tcp") for n in (2, 3, 4, 5, 8)]


def _large_param(i: int, n: int, transport: str) -> Any:
    marks = [pytest.mark.slow]
    if i % 3 and not FULL:
        marks.append(pytest.mark.skip(reason="large combination outside the default sample; "
                                             "set PYCOLL_TEST_FULL=1"))
    return pytest.param(n, transport, marks=marks, id=f"{n}-{transport}")


@pytest.mark.parametrize("n,transport", [_large_param(i, n, t) for i, (n, t) in enumerate(_LARGE)])
def test_large(n, transport):
    """Several MiB, counts not divisible by the world size or the segment size."""
    big = (3 << 20) // 4 + 7             # 3 MiB of float32, plus a few
    cases = _count_cases(n, [big], [("float32", "sum")], ("allreduce", "reduce", "broadcast"))
    per_rank = (1 << 20) // 8 + 3         # the split collectives: 1 MiB per rank
    cases += _count_cases(n, [per_rank], [("float64", "max")],
                          ("reduce_scatter", "allgather", "gather", "scatter", "alltoall"))
    cases = [c for c in cases if c[5] in ("out", "inplace")]
    _check(n, cases, env={"PYCOLL_TRANSPORTS": transport}, timeout=115.0)


def _torch_cases(comm: Any) -> list[list[float]]:
    """torch CPU tensors through every reducing algorithm, bfloat16 included."""
    import torch
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for coll in REDUCING:
            for algo in PLAIN[coll]:
                count = 1031 * comm.size
                t = (torch.arange(count) % 7 + comm.rank).to(dtype)
                if coll == "allreduce":
                    comm.allreduce(t, "sum", algo=algo)
                elif coll == "reduce":
                    comm.reduce(t, 0, "sum", algo=algo)
                else:
                    out = torch.zeros(1031, dtype=dtype)
                    comm.reduce_scatter(out, t, "sum", algo=algo)
                    t = out
                rows.append(t.float()[:50].tolist())
    return rows


def test_torch_and_bfloat16():
    pytest.importorskip("torch")
    n = 3
    results = run_ranks(_torch_cases, n)
    base = (np.arange(1031 * n) % 7) * n + sum(range(n))
    k = 0
    for _dtype in ("float32", "bfloat16"):
        for coll in REDUCING:
            for _algo in PLAIN[coll]:
                for r in range(n):
                    if coll == "reduce" and r != 0:
                        continue
                    want = base[r * 1031:r * 1031 + 50] if coll == "reduce_scatter" else base[:50]
                    assert results[r][k] == list(map(float, want)), (coll, _algo, _dtype, r)
                k += 1
