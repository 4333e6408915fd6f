"""The table of benchmarked operations: buffer layout, busbw factor, data patterns, checks.

Sizes follow nccl-tests (``doc/PERFORMANCE.md``): the size of an operation is the bytes of its
largest buffer -- the whole array for allreduce/broadcast/reduce, the gathered output for
allgather/gather, the full input for reduce_scatter/scatter, the whole send buffer for
alltoall.  For those "split" collectives each rank owns ``size / n`` bytes (at least one
element), so the reported size can round up for tiny messages.

Validation data are small positive integers (1..5, or 1..2 for ``prod``) that depend on the
rank and the element index, so every reduction is exact in every dtype (integer overflow
wraps identically on all ranks) and a misplaced block is detected.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CollSpec:
    name: str
    osu_title: str          # "# OSU MPI <title> v7.4" analogue
    nccl_name: str          # nccl-tests binary name
    factor: Callable[[int], float]
    factor_text: str
    split: bool             # size is the total over ranks
    rooted: bool
    reduction: bool
    pt2pt: bool = False
    #: one-sided (OSU's osu_put_latency family): (operation, "latency" | "bw" | "bibw")
    rma: tuple[str, str] | None = None


def _allreduce_factor(n: int) -> float:
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def _nm1_factor(n: int) -> float:
    return (n - 1) / n if n > 0 else 0.0


def _one(n: int) -> float:
    return 1.0


SPECS: dict[str, CollSpec] = {
    "allreduce": CollSpec("allreduce", "Allreduce Latency Test", "all_reduce_perf",
                          _allreduce_factor, "2(n-1)/n", False, False, True),
    "broadcast": CollSpec("broadcast", "Broadcast Latency Test", "broadcast_perf",
                          _one, "1", False, True, False),
    "reduce": CollSpec("reduce", "Reduce Latency Test", "reduce_perf",
                       _one, "1", False, True, True),
    "allgather": CollSpec("allgather", "Allgather Latency Test", "all_gather_perf",
                          _nm1_factor, "(n-1)/n", True, False, False),
    "reduce_scatter": CollSpec("reduce_scatter", "Reduce_scatter Latency Test",
                               "reduce_scatter_perf", _nm1_factor, "(n-1)/n", True, False, True),
    "alltoall": CollSpec("alltoall", "All-to-All Personalized Exchange Latency Test",
                         "alltoall_perf", _nm1_factor, "(n-1)/n", True, False, False),
    "gather": CollSpec("gather", "Gather Latency Test", "gather_perf",
                       _nm1_factor, "(n-1)/n", True, True, False),
    "scatter": CollSpec("scatter", "Scatter Latency Test", "scatter_perf",
                        _nm1_factor, "(n-1)/n", True, True, False),
    "barrier": CollSpec("barrier", "Barrier Latency Test", "barrier_perf",
                        _one, "1", False, False, False),
    "latency": CollSpec("latency", "Latency Test", "sendrecv_perf",
                        _one, "1", False, False, False, pt2pt=True),
    "bw": CollSpec("bw", "Bandwidth Test", "sendrecv_perf",
                   _one, "1", False, False, False, pt2pt=True),
    # one-sided, through a window (docs/windows.md); OSU's titles and binaries
    "put": CollSpec("put", "MPI_Put Latency Test", "osu_put_latency",
                    _one, "1", False, False, False, pt2pt=True, rma=("put", "latency")),
    "put_bw": CollSpec("put_bw", "MPI_Put Bandwidth Test", "osu_put_bw",
                       _one, "1", False, False, False, pt2pt=True, rma=("put", "bw")),
    "put_bibw": CollSpec("put_bibw", "MPI_Put Bi-directional Bandwidth Test", "osu_put_bibw",
                         _one, "1", False, False, False, pt2pt=True, rma=("put", "bibw")),
    "get": CollSpec("get", "MPI_Get latency Test", "osu_get_latency",
                    _one, "1", False, False, False, pt2pt=True, rma=("get", "latency")),
    "get_bw": CollSpec("get_bw", "MPI_Get Bandwidth Test", "osu_get_bw",
                       _one, "1", False, False, False, pt2pt=True, rma=("get", "bw")),
    "accumulate": CollSpec("accumulate", "MPI_Accumulate latency Test", "osu_acc_latency",
                           _one, "1", False, False, False, pt2pt=True,
                           rma=("accumulate", "latency")),
}


def measures_bandwidth(collective: str) -> bool:
    """The table's column is Bandwidth (MB/s) (osu_bw, osu_put_bw...), not latency."""
    spec = SPECS[collective]
    return collective == "bw" or (spec.rma is not None and spec.rma[1] != "latency")

ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2,
            "int8": 1, "uint8": 1, "int32": 4, "int64": 8}


def busbw_factor(collective: str, n: int) -> float:
    return SPECS[collective].factor(n)


def compute_dtype(dtype: str) -> np.dtype:
    """numpy dtype used for patterns and checks (bfloat16 is checked as float32)."""
    return np.dtype("float32" if dtype == "bfloat16" else dtype)


@dataclass(frozen=True)
class Layout:
    """Buffers of one benchmark step: name -> element count, plus the reported size."""
    count: int              # elements in the "operation" (nccl-tests count column)
    chunk: int              # per-rank elements for split collectives, else == count
    nbytes: int             # reported size S in bytes (algbw = S / t)
    buffers: dict[str, int]


def layout(collective: str, size: int, dtype: str, n: int) -> Layout:
    """Element counts for ``size`` requested bytes (rounded up to one element per rank)."""
    spec = SPECS[collective]
    es = ITEMSIZE[dtype]
    if collective == "barrier":
        return Layout(0, 0, 0, {})
    if spec.split:
        chunk = size // (es * n)
        if size > 0 and chunk == 0:
            chunk = 1
        total = chunk * n
        bufs = {
            "allgather": {"out": total, "inp": chunk},
            "reduce_scatter": {"out": chunk, "inp": total},
            "alltoall": {"out": total, "inp": total},
            "gather": {"out": total, "inp": chunk},
            "scatter": {"out": chunk, "inp": total},
        }[collective]
        return Layout(total, chunk, total * es, bufs)
    count = size // es
    if size > 0 and count == 0:
        count = 1
    if spec.pt2pt:
        return Layout(count, count, count * es, {"sbuf": count, "rbuf": count})
    return Layout(count, count, count * es, {"buf": count})


# ---------------------------------------------------------------------------
# data patterns
# ---------------------------------------------------------------------------
def pattern(rank: int, count: int, dtype: str, op: str = "sum", start: int = 0,
            salt: int = 0) -> np.ndarray:
    """Values of ``rank``'s elements ``start .. start+count-1``: small positive integers.

    Periodic in the index (period 5, or 2 for prod), built with ``np.resize`` so a 512 MiB
    pattern needs no index array.
    """
    cd = compute_dtype(dtype)
    if op == "prod":
        period = 2
        base = 1 + (rank + salt + start + np.arange(period)) % 2
    else:
        period = 5
        base = 1 + (rank * 7 + salt * 3 + (start + np.arange(period)) * 3) % 5
    return np.resize(base.astype(cd), count)


def reduce_patterns(n: int, count: int, dtype: str, op: str, start: int = 0) -> np.ndarray:
    """The expected result of reducing every rank's pattern with ``op``."""
    acc = pattern(0, count, dtype, op, start).copy()
    for r in range(1, n):
        p = pattern(r, count, dtype, op, start)
        if op in ("sum", "avg"):
            np.add(acc, p, out=acc)
        elif op == "prod":
            np.multiply(acc, p, out=acc)
        elif op == "min":
            np.minimum(acc, p, out=acc)
        elif op == "max":
            np.maximum(acc, p, out=acc)
        else:
            raise ValueError(f"unknown op {op!r}")
    if op == "avg":
        if acc.dtype.kind == "f":
            acc = (acc.astype(np.float64) / n).astype(acc.dtype)
        else:
            acc = acc // n
    return acc


def _matches(actual: np.ndarray, expected: np.ndarray, op: str) -> np.ndarray:
    """Per element: ``actual`` equals ``expected`` (tolerance only for avg / fp16)."""
    if op == "avg":
        if expected.dtype.kind == "f":
            rtol = 1e-2 if expected.dtype.itemsize <= 2 else 1e-5
            return np.isclose(actual.astype(np.float64), expected.astype(np.float64),
                              rtol=rtol, atol=0)
        # integer average: truncation or rounding are both accepted
        return np.abs(actual.astype(np.int64) - expected.astype(np.int64)) <= 1
    return actual == expected


def count_wrong(actual: np.ndarray, expected: np.ndarray, op: str = "sum") -> int:
    """Elements of ``actual`` that differ from ``expected`` (tolerance only for avg / fp16)."""
    actual = np.asarray(actual).reshape(-1)
    expected = np.asarray(expected).reshape(-1)
    if actual.shape != expected.shape:
        return max(actual.size, expected.size)
    return int(actual.size - np.count_nonzero(_matches(actual, expected, op)))


def first_wrong(actual: np.ndarray, expected: np.ndarray, op: str = "sum") -> int | None:
    """Index of the first element of ``actual`` that differs from ``expected`` (None: none
    does; 0 when the shapes differ)."""
    actual = np.asarray(actual).reshape(-1)
    expected = np.asarray(expected).reshape(-1)
    if actual.shape != expected.shape:
        return 0
    ok = _matches(actual, expected, op)
    return None if ok.all() else int(np.argmin(ok))


# ---------------------------------------------------------------------------
# per-collective validation: inputs to set, and what each rank expects afterwards
# ---------------------------------------------------------------------------
def validation_inputs(collective: str, lay: Layout, rank: int, n: int, root: int,
                      dtype: str, op: str) -> dict[str, np.ndarray]:
    """Arrays to write into this rank's buffers before the validation op.

    Output buffers are cleared to zero (a value no pattern produces) so stale data fail.
    """
    cd = compute_dtype(dtype)
    c = lay.chunk
    zeros = lambda k: np.zeros(k, dtype=cd)  # noqa: E731
    if collective in ("allreduce", "reduce"):
        return {"buf": pattern(rank, lay.count, dtype, op)}
    if collective == "broadcast":
        return {"buf": pattern(root, lay.count, dtype) if rank == root else zeros(lay.count)}
    if collective == "allgather":
        return {"inp": pattern(rank, c, dtype), "out": zeros(c * n)}
    if collective == "gather":
        return {"inp": pattern(rank, c, dtype), "out": zeros(c * n)}
    if collective == "reduce_scatter":
        return {"inp": pattern(rank, c * n, dtype, op), "out": zeros(c)}
    if collective == "alltoall":
        # block j of rank r's input goes to rank j: tag it with (r, j)
        inp = np.concatenate([pattern(rank, c, dtype, salt=j + 1) for j in range(n)]) \
            if n else zeros(0)
        return {"inp": inp, "out": zeros(c * n)}
    if collective == "scatter":
        if rank == root:
            inp = np.concatenate([pattern(j, c, dtype) for j in range(n)])
        else:
            inp = zeros(c * n)
        return {"inp": inp, "out": zeros(c)}
    return {}


def validation_expected(collective: str, lay: Layout, rank: int, n: int, root: int,
                        dtype: str, op: str) -> tuple[str, np.ndarray] | None:
    """(buffer name, expected contents) this rank checks, or None if it checks nothing."""
    c = lay.chunk
    if collective == "allreduce":
        return "buf", reduce_patterns(n, lay.count, dtype, op)
    if collective == "reduce":
        return ("buf", reduce_patterns(n, lay.count, dtype, op)) if rank == root else None
    if collective == "broadcast":
        return "buf", pattern(root, lay.count, dtype)
    if collective == "allgather":
        return "out", np.concatenate([pattern(j, c, dtype) for j in range(n)])
    if collective == "gather":
        if rank != root:
            return None
        return "out", np.concatenate([pattern(j, c, dtype) for j in range(n)])
    if collective == "reduce_scatter":
        return "out", reduce_patterns(n, c, dtype, op, start=rank * c)
    if collective == "alltoall":
        return "out", np.concatenate([pattern(j, c, dtype, salt=rank + 1) for j in range(n)])
    if collective == "scatter":
        return "out", pattern(rank, c, dtype)
    return None


def corrupt(arr: np.ndarray) -> np.ndarray:
    """A copy of ``arr`` with its first element changed (testing hook for ``-c``)."""
    out = np.array(arr, copy=True).reshape(-1)
    if out.size:
        out[0] = 98 if out[0] == 99 else 99     # far from any pattern value (1..5, sums)
    return out
