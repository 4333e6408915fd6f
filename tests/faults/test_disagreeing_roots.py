"""Ranks that disagree about a root (or, for send/recv, a dtype) never get a wrong answer.

Each case below returned normally on some ranks before (issue 32, part 3): a broadcast where
every rank names itself root left every rank its own data; a scatter where every rank names
itself root gave each rank its own block; send of float32 received into int32 handed back the
reinterpreted bits. The error came one call later, after the wrong result. Now a rooted
collective completes on no rank unless every rank agrees (``algorithms/agreement.py``), and
a receive compares the sender's dtype (``tags.p2p_tag``): every rank raises, none returns,
and none waits for its deadline. One exception, by design: a small broadcast on one host is
one way (the fast path's ``broadcast_one_way``: a root returns without hearing from anyone),
so a rank that names itself root returns its own, untouched buffer and raises at its next
collective (or finalize); its receivers still raise at once or get the bytes of a rank that
named itself root.
"""
from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks, run_threads

pytestmark = pytest.mark.timeout(120)
F32 = np.float32
#: the communicators' deadline: a case that ran into it would say CollectiveTimeout
DEADLINE = 30


def _roots(pattern: str, rank: int, size: int) -> int:
    """The root ``rank`` names: itself, 0 on rank 0 and 1 elsewhere, 0, or its neighbour."""
    if pattern == "self":
        return rank
    if pattern == "0/1/1":
        return 0 if rank == 0 else 1
    if pattern == "0":
        return 0
    return (rank + 1) % size                       # "next": nobody names itself


def _call(comm, collective: str, pattern: str) -> object:
    r, n = comm.rank, comm.size
    root = _roots(pattern, r, n)
    if collective == "broadcast":
        a = np.full(8, r, F32)
        comm.broadcast(a, root)
        return a.tolist()
    if collective == "scatter":
        out = np.zeros(2, F32)
        comm.scatter(out, np.arange(2 * n, dtype=F32) + 100 * r, root)
        return out.tolist()
    if collective == "gather":
        out = np.zeros(2 * n, F32)
        comm.gather(out, np.full(2, r, F32), root)
        return out.tolist()
    a = np.full(8, r + 1, F32)                      # reduce
    comm.reduce(a, root)
    return a.tolist()


def _outcome(comm, collective: str, pattern: str, warm: bool = False) -> tuple[str, str]:
    """How the disagreeing call ended on this rank; a rank it returned on (the one-way
    broadcast's roots) adds how its next call ended, after ``" | next: "``."""
    try:
        for _ in range(2 if warm else 0):   # agreeing calls first: fast path, caches warm
            _call(comm, collective, "0")
        value = _call(comm, collective, pattern)
    except pycoll.PycollError as e:
        return type(e).__name__, str(e)
    try:
        comm.barrier()
        after = "returned"
    except pycoll.PycollError as e:
        after = f"{type(e).__name__}: {e}"
    return "returned", f"{value!r} | next: {after}"


def _check(outcomes: list[tuple[str, str]]) -> None:
    """Every rank raised the disagreement (or was stopped by the rank that found it)."""
    kinds = [k for k, _ in outcomes]
    assert "CollectiveMismatch" in kinds, outcomes
    for kind, message in outcomes:
        assert kind in ("CollectiveMismatch", "Aborted"), outcomes
        assert "disagree" in message, outcomes
    found = [m for k, m in outcomes if k == "CollectiveMismatch"][0]
    assert "root" in found and "signature" in found, found


def _check_one_way(outcomes: list[tuple[str, str]], pattern: str) -> None:
    """A small broadcast on one host is one way (``kernels.broadcast_one_way``): a rank that
    names itself root returns without hearing from anyone, its buffer untouched (its own
    input, which is a root's result). Every other rank raises at once or receives the bytes
    of a rank that named itself root (receivers check the root's signature, which holds the
    root). Every rank that returned raises the disagreement at its next call."""
    size = len(outcomes)
    for rank, (kind, message) in enumerate(outcomes):
        if kind != "returned":
            assert kind in ("CollectiveMismatch", "Aborted") and "disagree" in message, outcomes
            continue
        value, after = message.split(" | next: ")
        root = _roots(pattern, rank, size)
        assert _roots(pattern, root, size) == root, (rank, outcomes)   # a self-named root's
        assert value == repr([float(root)] * 8), (rank, outcomes)
        assert after.startswith(("CollectiveMismatch", "Aborted")), (rank, outcomes)
        assert "disagree" in after, (rank, outcomes)


#: (collective, pattern, ranks); with 2 ranks "0/1/1" is "self"
CASES = [(c, p, n) for c in ("broadcast", "scatter", "gather", "reduce")
         for p in ("self", "0/1/1", "next") for n in (2, 3) if (p, n) != ("0/1/1", 2)]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("collective,pattern,size", CASES)
def test_disagreeing_roots_raise_on_every_rank(collective, pattern, size, transport):
    outcomes = run_ranks(_outcome, size, collective, pattern, collective_timeout=DEADLINE,
                         timeout=90, env={"PYCOLL_TRANSPORTS": transport})
    if (collective, transport) == ("broadcast", "shm") and pattern != "next":
        _check_one_way(outcomes, pattern)
    else:
        _check(outcomes)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("collective", ["broadcast", "scatter"])
def test_disagreeing_roots_after_warm_calls(collective, transport):
    """The same after agreeing calls of the same kind (fast path and call caches warm)."""
    outcomes = run_ranks(_outcome, 3, collective, "self", True, collective_timeout=DEADLINE,
                         timeout=90, env={"PYCOLL_TRANSPORTS": transport})
    if (collective, transport) == ("broadcast", "shm"):
        _check_one_way(outcomes, "self")
    else:
        _check(outcomes)


@pytest.mark.parametrize("collective,pattern,size", CASES)
def test_disagreeing_roots_inproc(collective, pattern, size):
    _check(run_threads(_outcome, size, collective, pattern, collective_timeout=DEADLINE,
                       timeout=90))


@pytest.mark.parametrize("collective,pattern", [("broadcast", "0/1/1"), ("reduce", "self"),
                                                 ("scatter", "next")])
def test_disagreeing_roots_beyond_direct_agreement(collective, pattern):
    """More ranks than agree directly (``agreement.DIRECT_MAX``): the dissemination rounds."""
    from pycoll.algorithms.agreement import DIRECT_MAX
    _check(run_threads(_outcome, DIRECT_MAX + 2, collective, pattern,
                       collective_timeout=DEADLINE, timeout=90))


def _agreeing(comm) -> list:
    """Rooted calls that agree still return the right data on every rank and root."""
    r, n = comm.rank, comm.size
    out = []
    for root in range(n):
        a = np.full(8, r, F32)
        comm.broadcast(a, root)
        s = np.zeros(2, F32)
        comm.scatter(s, np.arange(2 * n, dtype=F32) + 100 * r, root)
        g = np.zeros(2 * n, F32)
        comm.gather(g, np.full(2, r, F32), root)
        d = np.full(8, r + 1, F32)
        comm.reduce(d, root)
        out.append((a.tolist(), s.tolist(), g.tolist() if r == root else None,
                    d.tolist() if r == root else None))
    return out


def _check_agreeing(results: list, n: int) -> None:
    for r, per_root in enumerate(results):
        for root, (a, s, g, d) in enumerate(per_root):
            assert a == [float(root)] * 8
            assert s == [100.0 * root + 2 * r, 100.0 * root + 2 * r + 1]
            if r == root:
                assert g == [float(k // 2) for k in range(2 * n)]
                assert d == [float(n * (n + 1) // 2)] * 8


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_agreeing_roots_still_return_the_data(transport):
    _check_agreeing(run_ranks(_agreeing, 3, env={"PYCOLL_TRANSPORTS": transport}), 3)


def test_agreeing_roots_beyond_direct_agreement():
    from pycoll.algorithms.agreement import DIRECT_MAX
    n = DIRECT_MAX + 2
    _check_agreeing(run_threads(_agreeing, n, timeout=90), n)


# -- send/recv: the receiver learns the sender's dtype --------------------------------------
def _typed_p2p(comm, any_source: bool) -> tuple[str, str]:
    try:
        if comm.rank == 0:
            comm.send(np.ones(8, F32), 1)
            return "sent", ""
        b = np.full(8, 7, np.int32)
        try:
            comm.recv(b, None if any_source else 0)
        finally:
            untouched = bool((b == 7).all())
        return "returned", repr(b.tolist())
    except pycoll.PycollError as e:
        return type(e).__name__, f"{e} | untouched={untouched}"


@pytest.mark.parametrize("transport", ["tcp", "shm"])
@pytest.mark.parametrize("any_source", [False, True])
def test_send_float32_recv_int32_names_both_dtypes(transport, any_source):
    sender, receiver = run_ranks(_typed_p2p, 2, any_source, collective_timeout=DEADLINE,
                                 env={"PYCOLL_TRANSPORTS": transport})
    assert sender == ("sent", "")            # the sender's part is done: its data is fine
    kind, message = receiver
    assert kind == "CollectiveMismatch", receiver
    assert "sent float32 data" in message and "receive of int32" in message, message
    assert "untouched=True" in message, message       # nothing landed in the user's buffer


def test_send_recv_dtype_inproc():
    sender, receiver = run_threads(_typed_p2p, 2, False, collective_timeout=DEADLINE)
    assert receiver[0] == "CollectiveMismatch" and "receive of int32" in receiver[1], receiver


def _same_dtype_p2p(comm) -> list:
    """Matching dtypes still pass, tags and any-source included."""
    if comm.rank == 0:
        comm.send(np.arange(4, dtype=np.int64), 1, tag=3)
        comm.send(np.ones(2, F32), 1)
        return []
    a, b = np.zeros(4, np.int64), np.zeros(2, F32)
    comm.recv(a, 0, tag=3)
    comm.recv(b, None)
    return a.tolist() + b.tolist()


def test_same_dtype_p2p_still_passes():
    assert run_ranks(_same_dtype_p2p, 2)[1] == [0, 1, 2, 3, 1.0, 1.0]


# -- the signature is 32 bits wide ----------------------------------------------------------
def _premul_factors_agreeing_in_16_bits() -> tuple[float, float]:
    """Two premul_sum factors whose allreduce signatures share the low 16 bits only."""
    from pycoll.tags import signature
    seen: dict[int, tuple[float, int]] = {}
    for i in range(1, 100_000):
        factor = 1.0 + i / 1024
        sig = signature("allreduce", ("float32", 8, pycoll.ReduceOp.premul_sum(factor), None))
        low = sig & 0xFFFF
        if low in seen and seen[low][1] != sig:
            return seen[low][0], factor
        seen[low] = (factor, sig)
    raise AssertionError("no two signatures share their low 16 bits")


def test_tags_tell_apart_signatures_that_agree_in_16_bits():
    from pycoll.tags import SIG_BITS, collective_tag, conflicts, signature, tag_low_bits
    assert SIG_BITS >= 32
    f1, f2 = _premul_factors_agreeing_in_16_bits()
    s1, s2 = (signature("allreduce", ("float32", 8, pycoll.ReduceOp.premul_sum(f), None))
              for f in (f1, f2))
    assert s1 & 0xFFFF == s2 & 0xFFFF and s1 != s2
    low = tag_low_bits("allreduce", 5)
    assert collective_tag(9, low, s1) != collective_tag(9, low, s2)
    assert conflicts(collective_tag(9, low, s1), collective_tag(9, low, s2))


def _premul(comm, factors: tuple[float, float]) -> tuple[str, str]:
    a = np.ones(8, F32)
    try:
        comm.allreduce(a, pycoll.ReduceOp.premul_sum(factors[comm.rank]))
    except pycoll.PycollError as e:
        return type(e).__name__, str(e)
    return "returned", repr(a.tolist())


def test_ranks_whose_signatures_agree_in_16_bits_raise():
    """Two ranks whose calls differ only in a premul factor, with signatures equal in
    their low 16 bits (a 16-bit signature let them pass): a mismatch over tcp."""
    factors = _premul_factors_agreeing_in_16_bits()
    outcomes = run_ranks(_premul, 2, factors, collective_timeout=DEADLINE,
                         env={"PYCOLL_TRANSPORTS": "tcp"})
    assert {k for k, _ in outcomes} <= {"CollectiveMismatch", "Aborted"}, outcomes
    assert any(k == "CollectiveMismatch" for k, _ in outcomes), outcomes
