"""End-to-end integrity checks (``integrity=True``, ``PYCOLL_INTEGRITY``): a bit flipped in a
transport's receive buffer is caught every time, every rank raises ``DataCorruption`` naming
the same suspect, the right one, and checked calls on clean data never raise.

The flips come from the transports' test hook (``pycoll/transports/bitflip.py``, enabled by
``PYCOLL_TEST_FLIP=1`` in the ranks' environment and armed per trial in the rank that
receives the corrupted message). Every rank derives each trial's plan (victim, peer, which
message) from the same seed, so each knows which suspect must be named. Over verbs the tests
run in the Soft-RoCE VM (``bash tests/verbs/run_in_vm.sh --cmd 'python3 -m pytest -q
tests/faults/test_integrity.py -k verbs'``) and skip elsewhere.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks
from pycoll.transports import bitflip
from pycoll.transports.verbs.device import probe

pytestmark = pytest.mark.timeout(240)

_VERBS, _WHY = probe()
TRANSPORTS = ["shm", "tcp",
              pytest.param("verbs", marks=pytest.mark.skipif(
                  _VERBS is None, reason=f"verbs is not usable here: {_WHY}; run "
                  "tests/verbs/run_in_vm.sh --cmd 'python3 -m pytest "
                  "tests/faults/test_integrity.py -k verbs'"))]
TRIALS = 40
#: float32 bits a sum check must catch: high mantissa (20-22), exponent (23-30), sign (31)
FLOAT32_HIGH = range(20, 32)


def _env(transport: str, **more: str) -> dict[str, str]:
    return {"PYCOLL_TRANSPORTS": transport, "PYCOLL_TEST_FLIP": "1", **more}


def _positive(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """Values of one sign, 0.5 to 2: no partial sum cancels, so a flipped high bit changes
    an element by at least 1/16 of its chunk's mean magnitude (docs/integrity.md)."""
    return rng.uniform(0.5, 2.0, n).astype(dtype)


def _run(comm, call) -> tuple:
    """Run ``call``; what it raised, as comparable fields."""
    try:
        call()
    except pycoll.DataCorruption as e:
        assert f"rank {comm.rank}: " in str(e) and f"#{e.seq}" in str(e)
        assert "rerun" in str(e)
        return ("DataCorruption", e.collective, e.seq, tuple(e.suspects), tuple(e.links))
    return ("ok",)


def _flip_trials(comm, case: str, trials: int, seed: int) -> list:
    """``trials`` checked calls of ``case``, each with one bit flipped on one rank; per
    trial: (plan, outcome, the flip that fired here or None)."""
    hook = bitflip.flipper()
    assert hook is not None, "PYCOLL_TEST_FLIP=1 did not install the hook"
    rng = np.random.default_rng(seed + comm.rank)
    out = []
    p, r = comm.size, comm.rank
    for t in range(trials):
        plan = random.Random(seed * 1000 + t)          # the same on every rank
        victim = plan.randrange(p)
        peer = plan.choice([q for q in range(p) if q != victim])
        algo = "ring" if case.startswith("allreduce") and plan.random() < 0.5 else None
        if case.startswith("allreduce") and p > 2:
            algo, peer = "ring", (victim - 1) % p     # a ring receives from its left
        # the ring's first p - 1 messages are its reduce-scatter, the next p - 1 its
        # allgather; other algorithms may send one message only, and a flip in the checksum
        # exchange that follows is not what this tests
        nth = plan.randrange(1, 2 * p - 1) if algo == "ring" else 1
        if case == "alltoall":
            algo = "pairwise"
        if case == "allgatherv":
            nth = 2                           # the data; the first message holds the counts
        if case in ("broadcast", "send"):
            victim, peer = 1, 0
        if case.startswith("reduce_scatter"):
            # a ring: each rank receives p - 1 partial blocks from its left; the corrupted
            # one ends, reduced further, at its block's owner
            algo, peer, nth = "ring", (victim - 1) % p, plan.randrange(1, p)
        elif case.startswith("reduce"):   # the victim is the root: it receives from the tree
            algo = "binomial"
        itemsize, bits = {"allreduce_f32": (4, FLOAT32_HIGH), "reduce_f32": (4, FLOAT32_HIGH),
                          "allreduce_coalesced": (4, FLOAT32_HIGH),
                          "reduce_scatter_f32": (4, FLOAT32_HIGH),
                          "allreduce_i64": (8, range(64)), "reduce_i64": (8, range(64)),
                          "reduce_scatter_i64": (8, range(64))}.get(case, (1, range(8)))
        if r == victim:
            hook.arm(peer=peer, nth=nth, itemsize=itemsize, bits=bits, seed=seed + t)
        fired_before = len(hook.fired)
        if case == "allreduce_f32":
            a = _positive(rng, 4099, np.float32)
            result = _run(comm, lambda: comm.allreduce(a, algo=algo, integrity=True))
        elif case == "allreduce_i64":
            a = rng.integers(-2**62, 2**62, 1001, dtype=np.int64)
            result = _run(comm, lambda: comm.allreduce(a, algo=algo, integrity=True))
        elif case == "reduce_f32":
            a = _positive(rng, 4099, np.float32)
            result = _run(comm, lambda: comm.reduce(a, victim, algo=algo, integrity=True))
        elif case == "reduce_i64":
            a = rng.integers(-2**62, 2**62, 1001, dtype=np.int64)
            result = _run(comm, lambda: comm.reduce(a, victim, algo=algo, integrity=True))
        elif case == "reduce_scatter_f32":
            o = np.zeros(2053, np.float32)
            i = _positive(rng, 2053 * p, np.float32)
            result = _run(comm, lambda: comm.reduce_scatter(o, i, algo=algo, integrity=True))
        elif case == "reduce_scatter_i64":
            o = np.zeros(501, np.int64)
            i = rng.integers(-2**62, 2**62, 501 * p, dtype=np.int64)
            result = _run(comm, lambda: comm.reduce_scatter(o, i, algo=algo, integrity=True))
        elif case == "allreduce_coalesced":   # two dtype groups, each checked
            ts = [_positive(rng, 1000, np.float32), rng.integers(-9, 9, 70, dtype=np.int64),
                  _positive(rng, 3001, np.float32)]
            result = _run(comm, lambda: comm.allreduce_coalesced(ts, algo=algo, integrity=True))
        elif case == "allgather_coalesced":
            ins = [rng.standard_normal(100).astype(np.float32), rng.integers(0, 9, 33)]
            outs = [[np.zeros_like(t) for t in ins] for _ in range(p)]
            result = _run(comm, lambda: comm.allgather_coalesced(outs, ins, integrity=True))
        elif case == "allgatherv":
            a = rng.integers(0, 255, 300 + 50 * r, dtype=np.uint8)
            result = _run(comm, lambda: comm.allgatherv(a, integrity=True))
        elif case == "broadcast":
            a = rng.integers(0, 255, 5000, dtype=np.uint8)
            result = _run(comm, lambda: comm.broadcast(a, 0, integrity=True))
        elif case == "allgather":
            o = np.zeros(777 * p, np.float32)
            i = rng.standard_normal(777).astype(np.float32)
            result = _run(comm, lambda: comm.allgather(o, i, integrity=True))
        elif case == "allgather_async":     # the verdict comes through the work handle
            o = np.zeros(777 * p, np.float32)
            i = rng.standard_normal(777).astype(np.float32)
            result = _run(comm, lambda: comm.allgather(o, i, integrity=True,
                                                       async_op=True).wait())
        elif case == "gather":              # the victim is the root: it receives
            o = np.zeros(500 * p, np.float64)
            i = rng.standard_normal(500)
            result = _run(comm, lambda: comm.gather(o, i, victim, integrity=True))
        elif case == "scatter":             # the peer is the root: it sends
            o = np.zeros(500, np.int32)
            i = rng.integers(-9, 9, 500 * p, dtype=np.int32)
            result = _run(comm, lambda: comm.scatter(o, i, peer, integrity=True))
        elif case == "alltoall":
            o = np.zeros(300 * p, np.int16)
            i = rng.integers(-999, 999, 300 * p, dtype=np.int16)
            result = _run(comm, lambda: comm.alltoall(o, i, algo=algo, integrity=True))
        elif case == "send":
            a = rng.integers(0, 255, 3000, dtype=np.uint8)
            if r == 0:
                result = _run(comm, lambda: comm.send(a, 1, integrity=True))
            elif r == 1:
                result = _run(comm, lambda: comm.recv(a, 0, integrity=True))
            else:
                result = ("ok",)
            comm.barrier()
        else:
            raise ValueError(case)
        hook.disarm()
        fired = hook.fired[-1] if len(hook.fired) > fired_before else None
        out.append(((victim, peer, nth, algo),
                    result, None if fired is None else (fired.peer, fired.element, fired.bit)))
    return out


def _check_trials(results: list, case: str) -> None:
    size = len(results)
    for t in range(len(results[0])):
        (victim, peer, nth, algo), _, _ = results[0][t]
        fired = results[victim][t][2]
        assert fired is not None and fired[0] == peer, f"trial {t}: no flip fired on {victim}"
        outcomes = [results[r][t][1] for r in range(size)]
        where = f"{case} trial {t} (victim {victim}, peer {peer}, nth {nth}, algo {algo}, " \
                f"flip {fired}): {outcomes}"
        if case == "send":     # only the receiver can know (docs/integrity.md)
            assert outcomes[0] == ("ok",), where
            assert outcomes[1][0] == "DataCorruption" and outcomes[1][4] == ((0, 1),), where
            continue
        assert all(o[0] == "DataCorruption" for o in outcomes), where
        assert len(set(outcomes)) == 1, f"ranks disagree: {where}"
        _, _, _, suspects, links = outcomes[0]
        if case.startswith("reduce_scatter"):
            # the result is wrong on one rank only: the owner of the corrupted block; the
            # last partial a rank receives is its own block's
            assert len(suspects) == 1 and links == (), where
            if nth == size - 1 or size == 2:
                assert suspects == (victim,), where
        elif case.startswith("reduce"):
            assert suspects == (victim,) and links == (), where     # the root's result
        elif case.startswith("allreduce"):
            if algo == "ring" and nth < size:
                # the reduce-scatter: the victim reduces a corrupted block and hands it on:
                # every rank's result is wrong (the reduction is suspect)
                assert suspects == (), where
            elif algo == "ring" and size == 2:
                assert suspects == (victim,), where    # the allgather: the victim's copy
            elif algo == "ring":
                # the allgather forwards the victim's corrupted copy to the ranks after it
                assert victim in suspects and len(suspects) < size, where
            else:
                assert suspects in ((), (victim,)), where
        else:
            assert links == ((peer, victim),) and suspects == (victim,), where


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case,size", [("allreduce_f32", 2), ("allreduce_i64", 2),
                                       ("allreduce_f32", 4), ("allreduce_i64", 4),
                                       ("broadcast", 2), ("allgather", 2), ("alltoall", 3),
                                       ("allgather_async", 2), ("gather", 2), ("scatter", 2),
                                       ("send", 2), ("reduce_f32", 2), ("reduce_i64", 3),
                                       ("reduce_scatter_f32", 2), ("reduce_scatter_i64", 2),
                                       ("reduce_scatter_f32", 4), ("allreduce_coalesced", 2),
                                       ("allgather_coalesced", 2), ("allgatherv", 2)])
def test_bit_flip_always_detected(transport, case, size):
    """A flipped bit (sums: sign, exponent, high mantissa; integers and moves: any bit) in
    the receive buffer of one rank: DataCorruption on every rank, every trial, naming the
    same suspect, the right one; and the communicator stays usable after it."""
    results = run_ranks(_flip_trials, size, case, TRIALS, 11, env=_env(transport),
                        timeout=200)
    _check_trials(results, case)


def _clean_calls(comm, calls: int) -> dict:
    """Checked calls on data that stresses the float bound (large dynamic range,
    cancellation, halves, deterministic folds, every algorithm): no DataCorruption."""
    rng = np.random.default_rng(5 + comm.rank)
    shared = np.random.default_rng(5)                 # the same sizes on every rank
    algos = {"allreduce": [None, "ring", "recursive_doubling", "rabenseifner"]}
    big = np.full(10, 40000, np.float16)              # sums overflow to inf: not corruption
    comm.allreduce(big, integrity=True)
    assert np.isinf(big).all()
    done = 0
    for i in range(calls):
        n = int(shared.choice([1, 7, 1000, 4099, 70_001]))
        kind = i % 5
        if kind == 0:      # dynamic range: magnitudes 1e-30..1e30, random signs
            a = (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n)).astype(np.float32)
        elif kind == 1:    # cancellation: rank r adds x, the next rank -x, plus noise
            base = np.random.default_rng(i).standard_normal(n) * 1e6
            a = (base * (1 if comm.rank % 2 == 0 else -1)
                 + rng.standard_normal(n)).astype(np.float32)
        elif kind == 2:
            a = (rng.standard_normal(n) * 100).astype(np.float16)
        elif kind == 3:
            a = rng.standard_normal(n) * 10.0 ** rng.uniform(-200, 200, n)
        else:
            a = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64)
        op = ["sum", "avg", "sum", "sum", "sum"][kind] if i % 7 else "max"
        ordered = i % 3 == 0 or a.dtype == np.float16      # rank-order folds (numerics.md)
        algo = None if ordered else algos["allreduce"][i % 4]
        comm.allreduce(a, op, algo=algo, integrity=True, deterministic=(i % 3 == 0) or None)
        comm.broadcast(a, i % comm.size, integrity=True)
        o = np.zeros(n * comm.size, a.dtype)
        comm.allgather(o, a, integrity=True)
        comm.reduce(a, i % comm.size, op, integrity=True, deterministic=(i % 3 == 0) or None)
        comm.reduce_scatter(a, o, op, integrity=True, deterministic=(i % 3 == 0) or None)
        done += 5
    return {"checked": done}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_no_false_positives(transport):
    results = run_ranks(_clean_calls, 3, 60, env=_env(transport), timeout=200)
    assert all(r == {"checked": 300} for r in results), results


def _sampled(comm, calls: int, collective: str) -> list:
    """PYCOLL_INTEGRITY=sample:3 with a flip armed before every call: exactly the calls
    whose sequence number is a multiple of 3 raise, on every rank."""
    hook = bitflip.flipper()
    rng = np.random.default_rng(comm.rank)
    seen = []
    receiver = 0 if collective == "reduce" else 1     # reduce: the root (0) receives
    for i in range(calls):
        if comm.rank == receiver:
            hook.arm(peer=1 - receiver, itemsize=4, bits=FLOAT32_HIGH, seed=i)
        a = _positive(rng, 64, np.float32)
        o = np.zeros(32, np.float32)
        call = {"allreduce": lambda: comm.allreduce(a), "reduce": lambda: comm.reduce(a),
                "reduce_scatter": lambda: comm.reduce_scatter(o, a)}[collective]
        seen.append((comm.seq + 1, _run(comm, call)[0]))
        b = np.arange(16, dtype=np.float32)
        comm.allreduce(b, integrity=False)            # never checked, even when sampled
        seen.append((comm.seq, "unchecked"))
    hook.disarm()
    return seen


@pytest.mark.parametrize("collective", ["allreduce", "reduce", "reduce_scatter"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_sampling_checks_the_same_calls_everywhere(transport, collective):
    results = run_ranks(_sampled, 2, 30, collective,
                        env=_env(transport, PYCOLL_INTEGRITY="sample:3"), timeout=120)
    assert results[0] == results[1]
    checked = [(seq, what) for seq, what in results[0] if what != "unchecked"]
    for seq, what in checked:
        assert what == ("DataCorruption" if seq % 3 == 0 else "ok"), checked


def _uncovered(comm) -> list:
    """Calls without a check: ``integrity=True`` raises InvalidArgument before any byte
    moves (on every rank: the communicator stays in step); unset, under
    ``PYCOLL_INTEGRITY=sample:1``, they run unchecked and give the right result."""
    p, r = comm.size, comm.rank
    x = np.full(8, r + 1, np.int32)
    f = np.full(8, 2.0, np.float32)
    calls = {
        "reduce bxor": lambda **k: comm.reduce(x, 0, "bxor", **k),
        "reduce_scatter prod": lambda **k: comm.reduce_scatter(f[:8 // p], f, "prod", **k),
        "allreduce prod (floats)": lambda **k: comm.allreduce(f, "prod", **k),
        "allreduce_coalesced prod": lambda **k: comm.allreduce_coalesced([f], "prod", **k),
        "batch_p2p": lambda **k: comm.batch_p2p([("send", x, 1 - r, 0), ("recv", x.copy(),
                                                                         1 - r, 0)], **k)}
    seen = {}
    for name, call in calls.items():
        seq = comm.seq
        with pytest.raises(pycoll.InvalidArgument, match="integrity=True.*cover allreduce"):
            call(integrity=True)
        assert comm.seq == seq, f"{name}: a refused call was numbered"
        x[:], f[:] = r + 1, 2.0
        call()
        seen[name] = (int(x[0]), float(f[0]))
    return seen


def test_uncovered_calls_refused_or_unchecked():
    results = run_ranks(_uncovered, 2, env=_env("shm", PYCOLL_INTEGRITY="sample:1"),
                        timeout=60)
    assert results[0]["reduce bxor"][0] == 1 ^ 2            # the root's result
    assert results[1]["allreduce prod (floats)"][1] == 4.0
    assert results[0]["allreduce_coalesced prod"][1] == 4.0
    assert results[0]["reduce_scatter prod"][1] == 4.0


def test_hook_is_off_without_the_variable(monkeypatch):
    """Production: unset, receives are plain ``Request`` objects and no flipper exists."""
    monkeypatch.delenv("PYCOLL_TEST_FLIP", raising=False)
    monkeypatch.setattr(bitflip, "_READ_BY", None)
    monkeypatch.setattr(bitflip, "_FLIPPER", None)
    from pycoll.transports.matching import Request
    assert bitflip.receive_request() is Request and bitflip.flipper() is None


@pytest.mark.parametrize("value", ["sample:0", "sample:x", "often"])
def test_bad_integrity_variable(monkeypatch, value):
    monkeypatch.setenv("PYCOLL_INTEGRITY", value)
    from pycoll.comm.integrity import sample_every
    with pytest.raises(pycoll.InvalidArgument, match="PYCOLL_INTEGRITY"):
        sample_every()
