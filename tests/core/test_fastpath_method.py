"""``Communicator.allreduce``, ``broadcast`` and ``barrier``: their front
(``fastpath/callpath.py``, compiled where built) runs the calls of a kind the fast path has
bound, and hands every other call to the method that classifies it (``_allreduce``,
``_broadcast``, ``_barrier``).

The tests run real 2-rank jobs, once as installed and once with ``PYCOLL_FASTPATH_C=0`` (the
same source interpreted), and check per call shape that both give the same result, sequence
number and error, and which calls reached the classifying method (a profiler sees every
Python frame).
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from pycoll import fastpath
from pycoll.testing import run_ranks

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not fastpath.probe_limit(),
                                 reason="the fast path needs numba on Linux x86-64/aarch64")]


def _shapes(comm):
    """(name, call) pairs: each call takes an array and calls the method one way."""
    r = comm.rank
    return [
        ("allreduce(t)", "allreduce", lambda m, a: m(a)),
        ("allreduce(t, 'max')", "allreduce", lambda m, a: m(a, "max")),
        ("allreduce(t, op='min')", "allreduce", lambda m, a: m(a, op="min")),
        ("allreduce(t, 'sum', timeout=30)", "allreduce", lambda m, a: m(a, "sum", timeout=30)),
        ("allreduce(t, algo=None, async_op=False)", "allreduce",
         lambda m, a: m(a, algo=None, async_op=False)),
        ("allreduce(t, async_op=True)", "allreduce", lambda m, a: m(a, async_op=True).wait()),
        ("allreduce(t, algo='ring')", "allreduce", lambda m, a: m(a, algo="ring")),
        ("allreduce(t, deterministic=True)", "allreduce",
         lambda m, a: m(a, deterministic=True)),
        ("allreduce(tensor=t)", "allreduce", lambda m, a: m(tensor=a)),
        ("allreduce(t, 'sum', 'extra')", "allreduce", lambda m, a: m(a, "sum", "extra")),
        ("allreduce(t, 'nope')", "allreduce", lambda m, a: m(a, "nope")),
        ("allreduce(t, colour=1)", "allreduce", lambda m, a: m(a, colour=1)),
        ("allreduce(t, op='sum', op2=1)", "allreduce", lambda m, a: m(a, op="sum", op2=1)),
        ("allreduce(t[::2])", "allreduce", lambda m, a: m(a[::2])),
        ("broadcast(t)", "broadcast", lambda m, a: m(a)),
        ("broadcast(t, 1)", "broadcast", lambda m, a: m(a, 1)),
        ("broadcast(t, root=1)", "broadcast", lambda m, a: m(a, root=1)),
        ("broadcast(t, 0, integrity=None, timeout=None)", "broadcast",
         lambda m, a: m(a, 0, integrity=None, timeout=None)),
        ("broadcast(t, np.int64(1))", "broadcast", lambda m, a: m(a, np.int64(1))),
        ("broadcast(t, 2)", "broadcast", lambda m, a: m(a, 2)),
        ("broadcast(t, deterministic=None)", "broadcast", lambda m, a: m(a, deterministic=None)),
        ("broadcast(t, async_op=True)", "broadcast", lambda m, a: m(a, async_op=True).wait()),
        ("barrier()", "barrier", lambda m, a: m()),
        ("barrier(timeout=30)", "barrier", lambda m, a: m(timeout=30)),
        ("barrier(algo=None, async_op=False)", "barrier",
         lambda m, a: m(algo=None, async_op=False)),
        ("barrier(async_op=True)", "barrier", lambda m, a: m(async_op=True).wait()),
        ("barrier(algo='dissemination')", "barrier", lambda m, a: m(algo="dissemination")),
        ("barrier(a)", "barrier", lambda m, a: m(a)),
        ("barrier(root=0)", "barrier", lambda m, a: m(root=0)),
    ], r


def _compare(comm):
    import sys

    from pycoll.fastpath.compiled import callpath
    shapes, r = _shapes(comm)
    out = []
    for name, method, call in shapes:
        row = {"shape": name, "compiled": callpath.COMPILED}
        m = getattr(comm, method)
        for _ in range(3):           # the first call of a kind classifies it, then bound
            a = np.arange(8, dtype=np.float32) * (r + 1) + r
            seq = comm._exec.seq
            frames: list = []
            sys.setprofile(lambda frame, event, arg, _into=frames:
                           _into.append(frame.f_code.co_name) if event == "call" else None)
            try:
                call(m, a)
                result = a.tobytes()
            except TypeError:        # arguments not bound (Cython words it otherwise)
                result = "TypeError"
            except Exception as e:   # noqa: BLE001 - compared across the two
                result = f"{type(e).__name__}: {e}"
            finally:
                sys.setprofile(None)
        row["result"] = result
        row["seq"] = comm._exec.seq - seq
        row["classified"] = "_" + method in frames
        out.append(row)
    return out


def test_the_compiled_front_does_what_the_interpreted_one_does(monkeypatch):
    monkeypatch.delenv("PYCOLL_FASTPATH_C", raising=False)
    installed = run_ranks(_compare, 2, start_method="spawn", timeout=150)
    monkeypatch.setenv("PYCOLL_FASTPATH_C", "0")
    interpreted = run_ranks(_compare, 2, start_method="spawn", timeout=150)
    for rows, other in zip(installed, interpreted):
        for row, python in zip(rows, other):
            assert not python["compiled"], python
            for key in ("shape", "result", "seq", "classified"):
                assert row[key] == python[key], (row, python)
    rows = installed[0]
    taken = {row["shape"] for row in rows
             if not row["classified"] and not str(row["result"]).startswith("TypeError")}
    # the calls the fast path takes skip the classifying method (an asynchronous one too:
    # its bound call hands it to the generic execution itself); the others run it
    assert {"allreduce(t)", "allreduce(t, 'max')", "allreduce(t, op='min')",
            "allreduce(t, algo=None, async_op=False)", "allreduce(t, async_op=True)",
            "broadcast(t)", "broadcast(t, 1)", "broadcast(t, root=1)",
            "broadcast(t, 0, integrity=None, timeout=None)",
            "broadcast(t, async_op=True)", "barrier()", "barrier(timeout=30)",
            "barrier(algo=None, async_op=False)", "barrier(async_op=True)"} <= taken, taken
    assert not taken & {"allreduce(t, algo='ring')", "allreduce(t, deterministic=True)",
                        "allreduce(t, 'nope')", "allreduce(t[::2])",
                        "broadcast(t, np.int64(1))", "broadcast(t, 2)",
                        "barrier(algo='dissemination')"}, taken
    by_shape = {row["shape"]: row for row in rows}
    assert by_shape["allreduce(t, 'nope')"]["result"].startswith("InvalidArgument"), by_shape
    assert by_shape["allreduce(t, colour=1)"]["result"].startswith("TypeError"), by_shape
    assert by_shape["broadcast(t, 2)"]["result"].startswith("InvalidArgument"), by_shape


def _sampled(comm):
    import sys
    a = np.ones(8, np.float32)
    for _ in range(3):
        comm.allreduce(a)
    classified = []
    for _ in range(2):          # the 4th call is checked (sample:4), the 5th is not
        frames: list = []
        sys.setprofile(lambda frame, event, arg, _into=frames:
                       _into.append(frame.f_code.co_name) if event == "call" else None)
        try:
            comm.allreduce(a)
        finally:
            sys.setprofile(None)
        classified.append("_allreduce" in frames)
    return classified, float(a[0])


def test_sampled_integrity_checks_take_the_classifying_method():
    """``PYCOLL_INTEGRITY=sample:N`` checks every N-th call (by sequence number, alike on
    every rank): the front hands that one to the classifying method, which checks it."""
    out = run_ranks(_sampled, 2, env={"PYCOLL_INTEGRITY": "sample:4"}, timeout=150)
    assert out == [([True, False], 32.0), ([True, False], 32.0)], out


def _sampled_plan(comm):
    """As ``_sampled``, but rank 0 runs a persistent plan while rank 1 makes the calls."""
    import sys
    a = np.ones(8, np.float32)
    plan = comm.allreduce_init(a)
    run = plan.run if comm.rank == 0 else (lambda: comm.allreduce(a))
    for _ in range(3):
        run()
    classified = []
    for _ in range(2):          # the 4th call is checked (sample:4), the 5th is not
        frames: list = []
        sys.setprofile(lambda frame, event, arg, _into=frames:
                       _into.append(frame.f_code.co_name) if event == "call" else None)
        try:
            run()
        finally:
            sys.setprofile(None)
        classified.append("_allreduce" in frames)
    return classified, float(a[0])


def test_sampled_integrity_checks_a_plans_run_as_a_direct_call():
    """A plan's bound fast call gives way to the method on the runs ``sample:N`` checks,
    so that a rank running the plan and one making the call agree on which are checked."""
    out = run_ranks(_sampled_plan, 2, env={"PYCOLL_INTEGRITY": "sample:4"}, timeout=150)
    assert out == [([True, False], 32.0), ([True, False], 32.0)], out


def test_the_methods_have_their_names_docs_and_signatures():
    from pycoll.comm.communicator import Communicator
    for name in ("allreduce", "broadcast", "barrier"):
        method = getattr(Communicator, name)
        assert method.__name__ == name and method.__doc__
        assert list(inspect.signature(method).parameters)[0] == "self"
    assert "root" in inspect.signature(Communicator.broadcast).parameters
    assert "op" in inspect.signature(Communicator.allreduce).parameters
