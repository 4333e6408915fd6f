"""The compiled small-message path (pycoll/fastpath): results, agreement, failures, hygiene.

Every test runs real rank processes on one host (shm), where small allreduces and barriers
take the fast path; results are compared with the generic path's (forced with ``algo=``) and
with a float64 reference, bit for bit across ranks.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import pycoll
from pycoll import fastpath
from pycoll.testing import run_ranks

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not fastpath.probe_limit(),
                                 reason="the fast path needs numba on Linux x86-64/aarch64 "
                                        "(pip install numba)")]

NATIVE = list(fastpath.NATIVE_DTYPES)
OTHER = ["float16", "bool", "complex64"]
ARITH = ["sum", "prod", "min", "max", "avg"]
BITS = ["band", "bor", "bxor"]


def _input(rank: int, count: int, dtype: str, salt: int = 0) -> np.ndarray:
    base = (np.arange(count) * 7 + rank * 3 + salt) % 5 + 1
    if dtype.startswith("int"):
        base = base - 2
    if dtype == "bool":
        return (base % 2).astype(bool)
    return base.astype(dtype)


def _ops_for(dtype: str) -> list[str]:
    if dtype == "bool":
        return ["sum", "prod", "min", "max"] + BITS
    if dtype.startswith("complex"):
        return ["sum", "prod", "avg"]
    if dtype.startswith(("int", "uint")):
        return ARITH + BITS
    return ARITH


def _fast_and_generic(comm, cases, chunked=False):
    """Each case twice: on the fast path (in one stage, or ``chunked`` in several) and
    forced onto the generic ring."""
    fast = comm._fast
    assert fast is not None, "a one-host shm communicator must have the fast path"
    out = []
    for count, dtype, op in cases:
        a = _input(comm.rank, count, dtype, salt=count)
        before = fast.k
        comm.allreduce(a, op)
        stages = fast.k - before
        assert stages > 1 if chunked else stages == 1, (count, dtype, op, stages)
        b = _input(comm.rank, count, dtype, salt=count)
        comm.allreduce(b, op, algo="ring")
        assert fast.k == before + stages
        out.append((a.tobytes(), b.tobytes()))
    return out


@pytest.mark.parametrize("size", [2, 3])
def test_every_op_and_dtype_matches_the_generic_path(size):
    counts = [0, 1, 5, 64]
    cases = [(c, d, op) for d in NATIVE + OTHER for op in _ops_for(d) for c in counts]
    limit = fastpath.agreed_limits([fastpath.probe_record()] * size, size)[0]
    item = {"float16": 2, "bool": 1, "complex64": 8}
    cases += [(limit // (np.dtype(d).itemsize if d in NATIVE else item[d]), d, "sum")
              for d in ("float32", "int8", "float16")]
    _assert_fast_matches_generic(run_ranks(_fast_and_generic, size, cases, timeout=110), cases)


def _assert_fast_matches_generic(results, cases):
    """Every rank's fast result is the same bits, and equals the generic path's (exactly
    for integers, to rounding for floats: the generic ring reduces in another order)."""
    for i, (count, dtype, op) in enumerate(cases):
        for per_rank in results:
            fast, generic = per_rank[i]
            assert fast == results[0][i][0], (count, dtype, op, "ranks disagree")
            got, want = np.frombuffer(fast, dtype=dtype), np.frombuffer(generic, dtype=dtype)
            if dtype.startswith(("float", "complex")):
                np.testing.assert_allclose(got, want, rtol=1e-2 if dtype == "float16" else 1e-6,
                                           err_msg=str((count, dtype, op)))
            else:
                assert got.tobytes() == want.tobytes(), (count, dtype, op)


@pytest.mark.parametrize("size", [2, 3])
def test_chunked_allreduce_matches_the_generic_path(size):
    """Messages of several slots: uneven last chunk, shares of unequal length."""
    limit = fastpath.agreed_limits([fastpath.probe_record()] * size, size)[0]
    cases = []
    for d in NATIVE:
        per = limit // np.dtype(d).itemsize
        for i, op in enumerate(o for o in _ops_for(d)):
            cases.append(((per + 1, 3 * per + 5)[i % 2], d, op))
    _assert_fast_matches_generic(run_ranks(_fast_and_generic, size, cases, True, timeout=110),
                                 cases)


def _broadcasts(comm, cases):
    fast = comm._fast
    out = []
    for count, dtype, root in cases:
        a = _input(comm.rank, count, dtype, salt=root)
        before = fast.k
        comm.broadcast(a, root)
        assert fast.k > before, (count, dtype, root, "did not take the fast path")
        out.append(a.tobytes())
    return out


@pytest.mark.parametrize("size", [2, 3])
def test_broadcast_from_every_root(size):
    chunk = fastpath.agreed_limits([fastpath.probe_record()] * size, size)[0]
    cases = [(c, d, root) for root in range(size) for d in ("float32", "int8", "float64")
             for c in (0, 1, 7, chunk // 8 + 3, (3 * chunk) // 4 + 11)]
    results = run_ranks(_broadcasts, size, cases, timeout=110)
    for i, (count, dtype, root) in enumerate(cases):
        want = _input(root, count, dtype, salt=root).tobytes()
        for rank in range(size):
            assert results[rank][i] == want, (count, dtype, root, rank)


def _refuse_cross_memory_attach() -> None:
    """Make this process's process_vm_readv fail with EPERM, as a container's default
    seccomp profile does (a real seccomp filter: classic BPF on the system call number)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    nr = {"x86_64": 310, "aarch64": 270}[os.uname().machine]
    code = (Filter * 4)(Filter(0x20, 0, 0, 0),           # load the system call number
                        Filter(0x15, 0, 1, nr),          # process_vm_readv?
                        Filter(0x06, 0, 0, 0x00050000 | 1),   # then: fail with EPERM
                        Filter(0x06, 0, 0, 0x7FFF0000))  # else: allow
    assert libc.prctl(38, 1, 0, 0, 0) == 0               # PR_SET_NO_NEW_PRIVS
    prog = Program(4, code)
    assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # seccomp


def _single_copy(comm, refuse_on):
    fast = comm._fast
    if comm.rank == refuse_on:
        _refuse_cross_memory_attach()
    kinds, out = [], []
    # the smallest single-copy broadcast (a crowded host starts above the slots' limit)
    first = -(-fast.cma_bytes // 8) * 8
    for nbytes, root in ((first, 0), (8 << 20, 1), (3 << 20, comm.size - 1), (first, 1)):
        kind = comm.selected_algorithm("broadcast", nbytes)
        kinds.append(kind)
        a = _input(comm.rank, nbytes // 8, "float64", salt=root)
        before = fast.k
        comm.broadcast(a, root)
        assert (fast.k > before) == kind.startswith("fastpath"), (nbytes, root, kind)
        out.append((nbytes, root, a.tobytes() == _input(root, nbytes // 8, "float64",
                                                        salt=root).tobytes()))
    return kinds, out


@pytest.mark.parametrize("size,refuse_on", [(2, None), (3, None), (3, 2)])
def test_single_copy_broadcast(size, refuse_on):
    """From ``cma_bytes`` on a broadcast reads the root's buffer with process_vm_readv. When
    one rank may not (seccomp, here on rank 2), the first such call finds out on every rank,
    completes through the slots, and later ones go through the slots from the start."""
    results = run_ranks(_single_copy, size, refuse_on, timeout=110)
    for kinds, out in results:
        assert all(ok for *_, ok in out), out
        if refuse_on is None:
            assert set(kinds) == {"fastpath-broadcast-cma"}, kinds
        else:
            assert kinds[0] == "fastpath-broadcast-cma", kinds
            assert "fastpath-broadcast-cma" not in kinds[1:], kinds


def _direct_allreduce(comm, cases, refuse_on):
    """Each case on the fast path with the peers' buffers read directly (the size from
    which it does so lowered for the test: a crowded host would not use it), then forced
    onto the generic ring."""
    fast = comm._fast
    fast.direct_bytes = 64 * 1024
    if comm.rank == refuse_on:
        _refuse_cross_memory_attach()
    out, kinds = [], []
    for count, dtype, op in cases:
        a = _input(comm.rank, count, dtype, salt=count)
        kinds.append(comm.selected_algorithm("allreduce", a.nbytes))
        comm.allreduce(a, op)
        b = _input(comm.rank, count, dtype, salt=count)
        comm.allreduce(b, op, algo="ring")
        out.append((a.tobytes(), b.tobytes()))
    return out, kinds


@pytest.mark.parametrize("size,refuse_on", [(2, None), (3, None), (3, 1)])
def test_allreduce_reading_the_peers_buffers(size, refuse_on):
    """From ``direct_bytes`` on, each rank reduces its share reading every peer's copy with
    process_vm_readv, then reads the others' reduced shares. Refused on one rank (seccomp):
    the first call finds out before any buffer changed and runs through the slots."""
    cases = [(100001, "float32", "sum"), (70001, "int64", "max"), (65536 + 3, "float64", "prod"),
             (300001, "int8", "bxor"), (160000, "uint16", "min")]     # all above one slot
    results = run_ranks(_direct_allreduce, size, cases, refuse_on, timeout=110)
    _assert_fast_matches_generic([out for out, _ in results], cases)
    for _, kinds in results:
        if refuse_on is None:
            assert set(kinds) == {"fastpath-cma"}, kinds
        else:
            assert kinds[0] == "fastpath-cma" and "fastpath-cma" not in kinds[1:], kinds


def _torch_and_nan(comm):
    import torch
    out = {}
    for dtype in (torch.bfloat16, torch.float32, torch.int64):
        t = torch.arange(6, dtype=dtype) + comm.rank
        comm.allreduce(t, "sum")
        out[str(dtype)] = t.float().tolist()
    a = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    if comm.rank == 1:
        a[:] = [np.nan, 2.0, 4.0]
    b = a.copy()
    comm.allreduce(a, "min")
    comm.allreduce(b, "max")
    out["min"], out["max"] = a.tolist(), b.tolist()
    p = np.ones(4, dtype=np.float32) * (comm.rank + 1)
    comm.allreduce(p, pycoll.ReduceOp.premul_sum(0.5))
    out["premul"] = p.tolist()
    return out, comm._fast.k


def test_torch_tensors_nan_and_premul_sum():
    pytest.importorskip("torch")
    results = run_ranks(_torch_and_nan, 2)
    for out, k in results:
        assert k == 6
        assert out["torch.bfloat16"] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
        assert out["torch.int64"] == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
        assert np.isnan(out["min"][:2]).all() and out["min"][2] == 3.0    # NaN wins (numpy)
        assert np.isnan(out["max"][:2]).all() and out["max"][2] == 4.0
        assert out["premul"] == [1.5] * 4
    assert repr(results[0]) == repr(results[1])      # repr: NaN equals NaN there


def _torch_lane(comm):
    """Torch CPU tensors after the first call of their kind take the lane of numpy arrays
    (a numpy view, no classification); what does not fit it is classified as before."""
    import torch
    fast = comm._fast
    out = {}
    classified = []
    plan_buffer = comm._plan.buffer

    def counting(obj, *a, **k):           # the classification the lane skips
        classified.append(obj)
        return plan_buffer(obj, *a, **k)
    comm._plan.buffer = counting
    for name, t in (("1-D", torch.arange(4, dtype=torch.float32)),
                    ("2-D", torch.arange(12, dtype=torch.float64).reshape(3, 4)),
                    ("grad", torch.arange(4, dtype=torch.float32).requires_grad_()),
                    ("param", torch.nn.Parameter(torch.arange(4, dtype=torch.float32)))):
        got = []
        classified.clear()
        for _ in range(3):
            x = t.detach().clone() + comm.rank
            if name in ("grad", "param"):
                x = torch.nn.Parameter(x) if name == "param" else x.requires_grad_()
            before = fast.k
            comm.allreduce(x)
            got.append((x.detach().reshape(-1).tolist(), fast.k - before))
        out[name] = got
        out[name + " classified"] = len(classified)
    # a bfloat16 call is not remembered as the uint16 array numpy sees: a uint16 array of
    # the same size right after it is summed as integers
    b = torch.full((8,), 1.5 + comm.rank, dtype=torch.bfloat16)
    comm.allreduce(b)
    u = np.full(8, 40000 + comm.rank, dtype=np.uint16)
    comm.allreduce(u)
    out["bf16"] = b.float().tolist()
    out["uint16"] = u.tolist()
    out["remembered"] = sorted(str(k[2]) for k in fast.host_calls)
    broadcast = torch.full((5,), float(comm.rank + 7))
    for _ in range(2):
        comm.broadcast(broadcast, 1)
    out["broadcast"] = broadcast.tolist()
    return out


def test_torch_tensors_take_the_lane_of_numpy_arrays():
    pytest.importorskip("torch")
    results = run_ranks(_torch_lane, 2)
    assert results[0] == results[1]
    out = results[0]
    assert out["1-D"] == [([1.0, 3.0, 5.0, 7.0], 1)] * 3
    assert out["2-D"] == [([2.0 * i + 1 for i in range(12)], 1)] * 3
    for name in ("grad", "param"):
        assert out[name] == [([1.0, 3.0, 5.0, 7.0], 1)] * 3, name
    # plain tensors are classified by their first call only; autograd ones by every call
    assert [out[n + " classified"] for n in ("1-D", "2-D", "grad", "param")] == [1, 1, 3, 3]
    assert out["bf16"] == [4.0] * 8
    assert out["uint16"] == [(80001) % 65536] * 8
    assert "uint16" in out["remembered"] and out["remembered"].count("uint16") == 1
    assert out["broadcast"] == [8.0] * 5


def _many_calls(comm, n):
    """Back-to-back calls of several kinds: slots are reused every other call."""
    total = 0.0
    for i in range(n):
        a = np.full(3 + i % 4, float(comm.rank + i), dtype=np.float64)
        comm.allreduce(a)
        total += a.sum()
        if i % 7 == 0:
            comm.barrier()
        if i % 50 == 0:
            big = np.ones(1 << 18, dtype=np.float32)   # the generic path in between
            comm.allreduce(big, algo="ring")
            assert big[0] == comm.size
    return total, comm._fast.k


@pytest.mark.parametrize("size", [2, 4])
def test_many_back_to_back_calls_with_generic_calls_between(size):
    """With 4 ranks on this machine's cores the ranks outnumber them: the futex hand-off
    must still complete every call (correctness only; speed is benchmarks/compare.py's)."""
    n = 600
    results = run_ranks(_many_calls, size, n, timeout=110)
    expected = sum((3 + i % 4) * sum(r + i for r in range(size)) for i in range(n))
    for total, k in results:
        assert total == expected
        assert k == n + (n + 6) // 7


def _async_and_timeout(comm):
    a = np.full(4, comm.rank + 1.0, dtype=np.float32)
    b = np.full(4, comm.rank + 10.0, dtype=np.float32)
    w1 = comm.allreduce(a, async_op=True)          # queued on the worker, in order
    comm.allreduce(b, timeout=5)                   # waits behind it
    w1.wait()
    works = [comm.allreduce(np.full(2, float(i), dtype=np.float32), async_op=True)
             for i in range(5)]
    for w in works:
        w.wait()
    comm.barrier(async_op=True).wait()
    return a.tolist(), b.tolist(), comm._fast.k


def test_async_and_timeout_calls_run_in_order():
    for a, b, k in run_ranks(_async_and_timeout, 2):
        assert a == [3.0] * 4 and b == [21.0] * 4 and k == 8


def _limits(comm):
    fast = comm._fast
    return None if fast is None else fast.limit


def test_ranks_agree_on_the_limit_and_on_off():
    limits = run_ranks(_limits, 3, rank_env={1: {"PYCOLL_FASTPATH_BYTES": "1024"}})
    assert limits == [1024] * 3
    assert run_ranks(_limits, 2, rank_env={0: {"PYCOLL_FASTPATH": "0"}}) == [None, None]
    assert run_ranks(_limits, 2, env={"PYCOLL_TRANSPORTS": "tcp"}) == [None, None]


def _outcome(call):
    """(error type, message, seconds until it was raised) of ``call()``."""
    start = time.monotonic()
    try:
        call()
        return "no error", "", 0.0
    except pycoll.PycollError as e:
        return type(e).__name__, str(e), time.monotonic() - start


def _mismatch_in_fast_path(comm):
    return _outcome(lambda: comm.allreduce(np.ones(8 + comm.rank, dtype=np.float32)))


def test_different_counts_raise_collective_mismatch_at_once():
    for kind, message, elapsed in run_ranks(_mismatch_in_fast_path, 2, collective_timeout=20):
        assert kind == "CollectiveMismatch" and elapsed < 5, (kind, message)
        assert "32 bytes" in message and "36 bytes" in message and "disagree" in message


def _one_rank_dies(comm):
    if comm.rank == 1:
        comm.allreduce(np.ones(2, dtype=np.float32))
        os._exit(3)
    comm.allreduce(np.ones(2, dtype=np.float32))
    start = time.monotonic()        # rank 1 is on its way out
    try:
        comm.allreduce(np.ones(2, dtype=np.float32))
    except pycoll.PeerLost as e:
        return "PeerLost", str(e), time.monotonic() - start
    return "no error", "", 0.0


def test_a_dead_peer_raises_peer_lost_promptly():
    outcomes = run_ranks(_one_rank_dies, 2, expect_failure=True, collective_timeout=60)
    kind, value = outcomes[0]
    assert kind == "ok", value
    name, message, elapsed = value
    # promptly: found by the liveness check, not at the 60 s collective timeout (under a
    # second quiet; up to 23 s, counted from before the first call, beside two busy loops)
    assert name == "PeerLost" and "peer rank 1" in message and elapsed < 40, value


def _segments(comm, group_ranks):
    comm.barrier()                   # every rank has finished init (and mapped the segment)
    names = sorted(n for n in os.listdir("/dev/shm") if n.startswith("pycoll-")
                   and n.endswith("-fast"))
    g = comm.new_group(group_ranks)
    out = None
    if g is not None:
        a = np.full(3, comm.rank, dtype=np.int64)
        g.allreduce(a)
        out = a.tolist()
        g.barrier()
    comm.barrier()
    return names, out


def test_groups_get_their_own_segment_and_nothing_is_left_in_dev_shm():
    before = {n for n in os.listdir("/dev/shm") if n.endswith("-fast")}
    results = run_ranks(_segments, 3, [0, 2])
    for rank, (names, out) in enumerate(results):
        assert not names, names      # every segment is unlinked once all members mapped it
        assert out == ([2, 2, 2] if rank != 1 else None)
    assert {n for n in os.listdir("/dev/shm") if n.endswith("-fast")} <= before


def _plans(comm):
    small = np.zeros(5, dtype=np.float32)
    big = np.zeros(1 << 18, dtype=np.float32)
    p_small = comm.allreduce_init(small, "max")
    p_big = pycoll.allreduce_init(big)
    p_ring = comm.allreduce_init(small, algo="ring")
    paths = (p_small.path, p_big.path, p_ring.path)
    seen = []
    for i in range(20):
        small[:] = comm.rank * 10 + i          # new values into the same memory
        big[:] = i
        p_small.run()
        p_big()
        seen.append((small[0], big[0]))
    work = p_small.start()
    work.wait()
    small[:] = comm.rank + 1
    p_ring.run()
    errors = []
    for bad in (lambda: comm.allreduce_init(np.zeros(4, np.complex64), "max"),
                lambda: comm.allreduce_init(np.zeros(4), "nope"),
                lambda: comm.allreduce_init(np.zeros(4), algo="nope")):
        try:
            bad()
        except pycoll.InvalidArgument as e:
            errors.append(type(e).__name__)
    return paths, seen, small.tolist(), errors


def test_persistent_plans():
    for _rank, (paths, seen, last, errors) in enumerate(run_ranks(_plans, 2)):
        assert paths == ("fastpath", "fastpath-chunked", "ring")
        assert seen == [(10.0 + i, 2.0 * i) for i in range(20)]
        assert last == [3.0] * 5
        assert len(errors) == 3, errors


def _forced_barrier(comm):
    fast = comm._fast
    before = fast.k
    comm.barrier(algo="dissemination")      # forced: the generic algorithm, as for the others
    generic = fast.k - before
    comm.barrier()
    try:
        comm.barrier(algo="no-such-barrier")
        unknown = "accepted"
    except pycoll.PycollError as e:
        unknown = type(e).__name__
    return generic, fast.k - before, unknown


def test_forced_barrier_takes_the_generic_path():
    for generic, total, unknown in run_ranks(_forced_barrier, 3):
        assert (generic, total) == (0, 1)
        assert unknown != "accepted"


class _Tagged(np.ndarray):
    """A numpy subclass: not the exact type the compiled entry point was made for."""


def _arrays_the_entry_point_was_not_made_for(comm):
    fast = comm._fast
    out = []
    raw = np.zeros(4 * 6 + 1, dtype=np.uint8)
    shapes = {
        "behaved": lambda: np.empty(6, dtype=np.float32),
        "unaligned": lambda: raw[1:].view(np.float32),      # 4-byte floats at an odd address
        "2-D": lambda: np.empty((2, 3), dtype=np.float32),
        "subclass": lambda: np.empty(6, dtype=np.float32).view(_Tagged),
    }
    for _rounds in range(2):          # the second round finds every call already bound
        for name, make in shapes.items():
            a = make()
            a[...] = (np.arange(6, dtype=np.float32) + comm.rank * 10).reshape(a.shape)
            before = fast.k
            comm.allreduce(a)
            assert fast.k == before + 1, (name, "did not take the fast path")
            out.append((name, a.ravel().tolist(), bool(a.flags.aligned)))
    return out


def test_arrays_the_entry_point_was_not_made_for():
    """The single-slot kernel is called through numba's entry point for 1-D aligned
    C-contiguous writable ndarrays only (no type check there); any other array of the same
    dtype and size takes the fast path through the checked dispatcher, with the same result."""
    want = (np.arange(6) * 2 + 10).tolist()
    for per_rank in run_ranks(_arrays_the_entry_point_was_not_made_for, 2):
        for name, got, aligned in per_rank:
            assert got == want, name
            assert aligned == (name != "unaligned"), name


def _calls_of_one_size(comm):
    """Back-to-back calls of 16 bytes that differ only in dtype, op or root: each is checked
    against the previous call's kind before any lookup (``FastPath.last_allreduce``)."""
    fast = comm._fast
    out = []
    non_interned = "".join(["s", "u", "m"])
    mx = pycoll.ReduceOp("max")
    for it in range(3):
        for dtype, op in (("float32", "sum"), ("int32", "sum"), ("float32", "max"),
                          ("float32", non_interned), ("int32", mx), ("int32", "bxor"),
                          ("float64", "min"), ("uint8", "max")):
            count = 16 // np.dtype(dtype).itemsize
            a = _input(comm.rank, count, dtype, salt=it)
            before = fast.k
            comm.allreduce(a, op)
            assert fast.k == before + 1, (dtype, op, "did not take the fast path")
            out.append(("allreduce", dtype, str(op), it, a.tolist()))
            f = _input(comm.rank, 4, "float32", salt=it)
            as_ints = f.view(np.int32)      # another array object over the same bytes
            comm.allreduce(as_ints, "sum")
            out.append(("view", "int32", "sum", it, as_ints.tolist()))
        for root in (0, 1, 0):
            b = _input(comm.rank, 4, "float32", salt=root + 10 * it)
            comm.broadcast(b, root)
            out.append(("broadcast", "float32", root, it, b.tolist()))
    return out


def test_calls_of_one_size_with_other_dtypes_ops_and_roots():
    """A call of the same size as the previous one but another dtype, op (an equal string
    that is another object, a ReduceOp) or root gets its own kernel and its right result."""
    ranks = 2
    reduce = {"sum": np.add, "max": np.maximum, "min": np.minimum, "bxor": np.bitwise_xor}
    results = run_ranks(_calls_of_one_size, ranks)
    assert results[0] == results[1]
    for kind, dtype, op, it, got in results[0]:
        if kind == "broadcast":
            want = _input(op, 4, "float32", salt=op + 10 * it).tolist()
        else:
            count = 16 // np.dtype(dtype).itemsize
            if kind == "view":
                inputs = [_input(r, count, "float32", salt=it).view(np.int32)
                          for r in range(ranks)]
            else:
                inputs = [_input(r, count, dtype, salt=it) for r in range(ranks)]
            want = reduce[op].reduce(inputs).astype(dtype).tolist()
        assert got == want, (kind, dtype, op, it)


def _broadcast_kind_by_crowding(comm):
    from pycoll.transports.progress import WaitPolicy
    return WaitPolicy.crowded, comm._fast.broadcast_limit, [
        comm.selected_algorithm("broadcast", n) for n in (64 << 10, 1 << 20, 8 << 20)]


def test_crowded_hosts_broadcast_through_the_slots_up_to_their_limit():
    """With more ranks than cores, the single copy starts above the slots' limit (measured:
    the slots were 1.3-2x faster there); with a core per rank, from 16 KiB."""
    for size in (2, 4):
        for crowded, limit, kinds in run_ranks(_broadcast_kind_by_crowding, size):
            if crowded:
                assert limit >= 1 << 20, limit
                assert kinds == ["fastpath-broadcast"] * 2 + ["fastpath-broadcast-cma"], kinds
            else:
                assert kinds == ["fastpath-broadcast-cma"] * 3, kinds


def _kinds_disagree(comm):
    """Rank 1 believes the host is crowded (as another CPU affinity would make it): a 64 KiB
    broadcast is a single copy on rank 0 and goes through the slots on rank 1."""
    fast = comm._fast
    fast.cma_bytes = 16 << 10 if comm.rank == 0 else fast.broadcast_limit + 1
    fast._calls.clear()
    return _outcome(lambda: comm.broadcast(np.zeros(8 << 10, dtype=np.float64), 0))


def test_ranks_that_chose_different_kernels_raise_collective_mismatch():
    for kind, message, elapsed in run_ranks(_kinds_disagree, 2, collective_timeout=20):
        assert kind == "CollectiveMismatch" and elapsed < 5, (kind, message)


SLOW_RANK = """
import os, sys, time
from rendezvous import TCPStore
from pycoll.fastpath.segment import SharedSlots
from pycoll.transports.shm.cma import process_exited
from pycoll.transports.shm.segment import sweep
rank, port, folder, first = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
done = os.path.join(folder, "rank1-done")
store = TCPStore("127.0.0.1", port, token="", timeout=60)
if rank == 2:                   # slow: reaches the segment after rank 1 has finished
    deadline = time.monotonic() + 60
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.02)
SharedSlots.setup(store, rank, 3, 256, 30.0)
if rank == 1:                   # done: once rank 0 has gone too (5 s at most), it closes,
    deadline = time.monotonic() + 5     # and its shm close sweeps the dead's segments
    while not process_exited(first) and time.monotonic() < deadline:
        time.sleep(0.02)
    sweep()
    open(done, "w").close()
print("MAPPED", rank, flush=True)
"""


def test_the_segment_outlives_a_finished_creator_until_every_rank_mapped_it(tmp_path):
    """Seen under load: rank 0 made the segment, finished and exited; rank 1 finished too,
    and its close swept the segments of dead creators, rank 0's among them; rank 2, slower,
    then found no segment ("vanished before this rank mapped it"). Rank 0 now returns only
    once every rank has mapped it."""
    import subprocess
    import sys

    from rendezvous import StoreServer

    script = tmp_path / "rank.py"
    script.write_text(SLOW_RANK)
    server = StoreServer("127.0.0.1", 0).start()
    procs = []
    try:
        for rank in range(3):
            first = procs[0].pid if procs else 0
            procs.append(subprocess.Popen(
                [sys.executable, str(script), str(rank), str(server.port), str(tmp_path),
                 str(first)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": os.getcwd()}))
        outputs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        server.close()
    for rank, (p, (out, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"MAPPED {rank}" in out, (rank, err[-2000:])
