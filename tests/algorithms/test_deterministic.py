"""``deterministic=True``: every reducing call returns the rank-order left fold, bit for bit.

The contract (docs/numerics.md): ``((x0 op x1) op x2) op ...`` element-wise, in the buffer's
dtype, except float16/bfloat16 sums (avg, premul_sum), which accumulate in float32 and round
once. The reference below is written here in plain numpy (and torch for bfloat16's
conversions), apart from the library's own fold, so that a wrong fold in the library cannot
agree with itself.

bfloat16 travels as torch tensors (pycoll reads torch's bfloat16), made and read back as
views of numpy's uint16 bits: the test process never computes with torch, so that ranks
forked from it can (torch's thread pool does not survive a fork). Without torch, bfloat16
leaves the sweeps (numpy has no bfloat16) and only its own tests skip.

The sweep runs allreduce, reduce and reduce_scatter on float16, bfloat16, float32 and float64
with data whose signs and exponents are mixed (so the order matters), sizes from one element
to several segments with uneven chunks, 2, 3, 4 and 8 ranks, on shm (the fast path and the
generic path), tcp and the in-process transport. The same data without ``deterministic``
shows that the algorithms' own orders give other bits, so the sweep can fail. Every rank
checks its own result: the ranks return only mismatch reports.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import pycoll
from pycoll.algorithms import ALGORITHMS
from pycoll.algorithms.selection import ORDERED_ALGORITHMS
from pycoll.testing import run_ranks, run_threads

try:
    import torch
except ImportError:      # an install without the torch extra: no bfloat16 to test
    torch = None

pytestmark = pytest.mark.timeout(300)

#: the algorithms a call without compress= may force (the compressed ones need compress=)
PLAIN = {coll: [name for name, a in table.items() if not a.compressed]
         for coll, table in ALGORITHMS.items()}

FULL = os.environ.get("PYCOLL_TEST_FULL") == "1"
DTYPES = tuple(d for d in ("float16", "bfloat16", "float32", "float64")
               if torch is not None or d != "bfloat16")
NEEDS_TORCH = pytest.mark.skipif(torch is None, reason="bfloat16 needs torch "
                                                       "(pip install 'pycoll[torch]')")
SIZES = (1, 7, 1000, 4097, 300_001)          # 300001 float32: several uneven segments
COLLECTIVES = ("allreduce", "reduce", "reduce_scatter")


# -- data and the contract, computed the plain way -----------------------------------------
def _inputs(rank: int, count: int, dtype: str, salt: int) -> np.ndarray:
    """Mixed signs and exponents: sums whose bits depend on the order. float64 values (the
    bfloat16 ones as float32, from which torch rounds)."""
    rng = np.random.default_rng(1000 * salt + rank)
    spread = 3 if dtype == "float16" else 8       # stay inside float16's range
    return rng.standard_normal(count) * 10.0 ** rng.integers(-spread, spread, count)


def _bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, rounded to nearest even (no NaNs in this data)."""
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _tensor(values: np.ndarray, dtype: str) -> Any:
    if dtype == "bfloat16":
        return torch.from_numpy(_bf16(values)).view(torch.bfloat16)
    return values.astype(dtype)


def _is_tensor(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _as_f32(x: Any) -> np.ndarray:
    if _is_tensor(x):
        bits = x.contiguous().view(torch.int16).numpy().view(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return np.asarray(x, dtype=np.float32)


def _round(acc: np.ndarray, dtype: str) -> Any:
    if dtype == "bfloat16":
        return torch.from_numpy(_bf16(acc)).view(torch.bfloat16)
    return acc.astype(dtype)


def contract(inputs: list[Any], dtype: str) -> Any:
    """The rank-order left fold of ``inputs``: in float32 (rounded once) for the halves,
    in the dtype otherwise."""
    if dtype in ("float16", "bfloat16"):
        acc = _as_f32(inputs[0]).copy()
        for x in inputs[1:]:
            acc = acc + _as_f32(x)
        return _round(acc, dtype)
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = acc + x
    return acc


def _bits(x: Any) -> bytes:
    return x.contiguous().view(torch.int16).numpy().tobytes() if _is_tensor(
        x) else np.ascontiguousarray(x).tobytes()


def _copy(x: Any) -> Any:
    if _is_tensor(x):          # a copy of the bits, not a torch computation
        return torch.from_numpy(x.view(torch.int16).numpy().copy()).view(torch.bfloat16)
    return x.copy()


def _chunk(x: Any, rank: int, n: int) -> Any:
    count = x.shape[0] // n
    return x[rank * count:(rank + 1) * count]


# -- what every rank runs ------------------------------------------------------------------
def _cases(n: int, sizes: tuple[int, ...]) -> list[tuple[str, str, int, int]]:
    cases = []
    salt = 0
    for coll in COLLECTIVES:
        for dtype in DTYPES:
            for count in sizes:
                salt += 1
                count = count * n if coll == "reduce_scatter" else count
                cases.append((coll, dtype, count, salt))
    return cases


def _run(comm: Any, coll: str, dtype: str, count: int, salt: int, **kw: Any) -> Any:
    """One call; returns what this rank's result must equal (None: nothing to check)."""
    n, r = comm.size, comm.rank
    values = [_inputs(q, count, dtype, salt) for q in range(n)]
    inputs = [_tensor(v, dtype) for v in values]
    mine = _copy(inputs[r])
    expected = contract(inputs, dtype)
    if coll == "allreduce":
        comm.allreduce(mine, **kw)
        return mine, expected
    if coll == "reduce":
        root = salt % n
        comm.reduce(mine, root, **kw)
        return (mine, expected) if r == root else (None, None)
    out = _copy(_chunk(mine, 0, n))
    comm.reduce_scatter(out, mine, **kw)
    return out, _chunk(expected, r, n)


def _sweep(comm: Any, sizes: tuple[int, ...], kw: dict[str, Any]) -> list[str]:
    wrong = []
    for coll, dtype, count, salt in _cases(comm.size, sizes):
        if kw.get("algo") not in (None, *ALGORITHMS[coll]):
            continue
        got, expected = _run(comm, coll, dtype, count, salt, **kw)
        if got is not None and _bits(got) != _bits(expected):
            wrong.append(f"{coll} {dtype} {count} elements, rank {comm.rank} of {comm.size}")
    return wrong


def _sweep_all_algorithms(comm: Any, sizes: tuple[int, ...]) -> dict[str, list[str]]:
    """deterministic=True with every path a caller can ask for: automatic, ``ordered``
    forced, and every other algorithm refused (an error on every rank, no byte moved)."""
    found = {"auto": _sweep(comm, sizes, {"deterministic": True})}
    for algo in sorted(ORDERED_ALGORITHMS):
        found[algo] = _sweep(comm, sizes, {"deterministic": True, "algo": algo})
    refused = []
    for coll in COLLECTIVES:
        for algo, record in ALGORITHMS[coll].items():
            if algo in ORDERED_ALGORITHMS or record.compressed:    # (compress= only)
                continue
            x = np.ones(8 * comm.size, dtype=np.float32)
            try:
                if coll == "reduce_scatter":
                    comm.reduce_scatter(np.empty(8, np.float32), x, algo=algo,
                                        deterministic=True)
                elif coll == "reduce":
                    comm.reduce(x, 0, algo=algo, deterministic=True)
                else:
                    comm.allreduce(x, algo=algo, deterministic=True)
            except pycoll.InvalidArgument as e:
                if "ordered" not in str(e):
                    refused.append(f"{coll} {algo}: {e}")
            else:
                refused.append(f"{coll} {algo}: not refused")
    found["refused"] = refused
    return found


def _ordinary(comm: Any, count: int) -> dict[str, bytes]:
    """float32 allreduce of the same data by every algorithm, without deterministic."""
    out = {}
    for algo in PLAIN["allreduce"]:
        x = _inputs(comm.rank, count, "float32", 99).astype(np.float32)
        comm.allreduce(x, algo=algo)
        out[algo] = x.tobytes()
    return out


# -- the tests -----------------------------------------------------------------------------
@pytest.mark.parametrize("transport,n", [("shm", 2), ("shm", 3), ("shm", 4), ("tcp", 3),
                                         ("tcp", 4), ("shm", 8)])
def test_every_path_returns_the_rank_order_fold(transport, n):
    sizes = SIZES if n <= 4 else SIZES[:4]
    env = {"PYCOLL_TRANSPORTS": transport}
    for outcome in run_ranks(_sweep_all_algorithms, n, sizes, env=env, timeout=240):
        assert all(wrong == [] for wrong in outcome.values()), outcome
        assert set(outcome) == {"auto", "refused", *ORDERED_ALGORITHMS}


@pytest.mark.parametrize("n", [2, 3])
def test_the_generic_path_gives_the_fast_paths_bits(n):
    """The fast path off: the same sweep, every call on the generic ``ordered``."""
    env = {"PYCOLL_TRANSPORTS": "shm", "PYCOLL_FASTPATH": "0"}
    for wrong in run_ranks(_sweep, n, SIZES, {"deterministic": True}, env=env, timeout=240):
        assert wrong == []


@pytest.mark.parametrize("n", [3, 8])
def test_in_process_ranks(n):
    for wrong in run_threads(_sweep, n, SIZES[:4], {"deterministic": True}, timeout=240):
        assert wrong == []


def test_async_and_segment_sizes_keep_the_bits():
    """Asynchronous calls, and a tiny fold segment (many pipelined segments), change
    nothing."""
    env = {"PYCOLL_TRANSPORTS": "tcp", "PYCOLL_SEGMENT_BYTES": "4096"}
    for wrong in run_ranks(_sweep_async, 3, env=env, timeout=240):
        assert wrong == []


def _sweep_async(comm: Any) -> list[str]:
    wrong = []
    for dtype in DTYPES:
        count = 20_001
        values = [_inputs(q, count, dtype, 5) for q in range(comm.size)]
        inputs = [_tensor(v, dtype) for v in values]
        mine = _copy(inputs[comm.rank])
        comm.allreduce(mine, deterministic=True, async_op=True).wait()
        if _bits(mine) != _bits(contract(inputs, dtype)):
            wrong.append(dtype)
    return wrong


def test_without_deterministic_the_algorithms_disagree():
    """What makes the sweep meaningful: the algorithms' own orders give other bits on the
    same data (ring, recursive doubling and Rabenseifner each group the sums their way)."""
    results = run_ranks(_ordinary, 4, 4097, env={"PYCOLL_TRANSPORTS": "tcp"})
    by_algo = results[0]
    values = [_inputs(q, 4097, "float32", 99).astype(np.float32) for q in range(4)]
    folded = contract(values, "float32").tobytes()
    assert by_algo["ordered"] == by_algo["ordered_gather"] == folded
    others = {name: bits for name, bits in by_algo.items() if name not in ORDERED_ALGORITHMS}
    assert any(bits != folded for bits in others.values()), "every algorithm gave the fold"
    assert len(set(others.values()) | {folded}) >= 3


def _exact_any_order(comm: Any) -> list[str]:
    """Integers and min/max are exact in any order: deterministic=True accepts any algorithm."""
    wrong = []
    for algo in PLAIN["allreduce"]:
        x = np.arange(1000, dtype=np.int64) * (comm.rank + 1)
        comm.allreduce(x, algo=algo, deterministic=True)
        if not np.array_equal(x, np.arange(1000) * sum(range(1, comm.size + 1))):
            wrong.append(f"int64 {algo}")
        y = _inputs(comm.rank, 100, "float32", 3).astype(np.float32)
        comm.allreduce(y, "max", algo=algo, deterministic=True)
        top = np.max([_inputs(q, 100, "float32", 3).astype(np.float32)
                      for q in range(comm.size)], axis=0)
        if not np.array_equal(y, top):
            wrong.append(f"max {algo}")
    return wrong


def test_integers_and_min_max_take_any_algorithm():
    for wrong in run_ranks(_exact_any_order, 3, env={"PYCOLL_TRANSPORTS": "tcp"}):
        assert wrong == []


def _defaults(comm: Any) -> tuple[bool, str, bool]:
    x = _inputs(comm.rank, 4097, "float32", 11).astype(np.float32)
    comm.allreduce(x, algo="ring") if not comm.deterministic else comm.allreduce(x)
    values = [_inputs(q, 4097, "float32", 11).astype(np.float32) for q in range(comm.size)]
    return comm.deterministic, comm.accumulate, x.tobytes() == contract(values,
                                                                         "float32").tobytes()


def test_the_communicator_default_comes_from_the_environment():
    env = {"PYCOLL_TRANSPORTS": "tcp", "PYCOLL_DETERMINISTIC": "1"}
    for det, acc, equal in run_ranks(_defaults, 3, env=env):
        assert det and acc == "fp32" and equal


def _disagree(comm: Any) -> str:
    x = _inputs(comm.rank, 4097, "float32", 12).astype(np.float32)
    try:
        comm.allreduce(x, deterministic=comm.rank == 0, timeout=20)
    except pycoll.PycollError as e:
        return type(e).__name__
    return "returned"


def test_ranks_that_disagree_about_deterministic_raise():
    """Whether a call folds in rank order is part of its signature: a rank asking for it
    beside ranks that do not fails on every rank (no hang, no wrong answer)."""
    outcomes = run_ranks(_disagree, 3, env={"PYCOLL_TRANSPORTS": "tcp"}, timeout=60)
    assert all(o in ("CollectiveMismatch", "Aborted") for o in outcomes), outcomes
    assert "CollectiveMismatch" in outcomes


def _half_errors(comm: Any, dtype: str) -> tuple[float, float]:
    """How often a half-precision sum misses the correctly rounded result (the float64 sum
    of the inputs, rounded to the dtype): accumulated in float32, and in the dtype. (The
    error against the float64 sum itself includes the output's own rounding, which no
    accumulation avoids; docs/numerics.md reports both.)"""
    count = 20_000
    values = [_inputs(q, count, dtype, 21) for q in range(comm.size)]
    exact = np.sum([_as_f32(_tensor(v, dtype)).astype(np.float64) for v in values], axis=0)
    best = _as_f32(_round(exact.astype(np.float32), dtype))
    missed = []
    for accumulate in ("fp32", "dtype"):
        x = _tensor(values[comm.rank], dtype)
        comm.allreduce(x, deterministic=True, accumulate=accumulate)
        got = _as_f32(x)
        ok = np.isfinite(best)
        missed.append(float(np.mean(got[ok] != best[ok])))
    return missed[0], missed[1]


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=NEEDS_TORCH)])
def test_float32_accumulation_of_halves_rounds_correctly(dtype):
    for fp32, native in run_ranks(_half_errors, 8, dtype, env={"PYCOLL_TRANSPORTS": "shm"},
                                  timeout=120):
        assert fp32 < 0.001 and fp32 * 4 <= native, (fp32, native)


def _large(comm: Any) -> list[str]:
    """64 MiB of float32 (and 32 MiB of bfloat16): many segments, the fast path's chunks."""
    wrong = []
    for dtype, count in (("float32", 1 << 24), ("bfloat16", 1 << 24)):
        if dtype not in DTYPES:
            continue
        values = [_inputs(q, count, dtype, 77) for q in range(comm.size)]
        inputs = [_tensor(v, dtype) for v in values]
        mine = _copy(inputs[comm.rank])
        comm.allreduce(mine, deterministic=True)
        if _bits(mine) != _bits(contract(inputs, dtype)):
            wrong.append(f"{dtype} {count} on {comm.selected_algorithm('allreduce', 4 * count)}")
    return wrong


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_large_buffers(transport):
    for wrong in run_ranks(_large, 2, env={"PYCOLL_TRANSPORTS": transport}, timeout=240):
        assert wrong == []
