"""The fast call path (``fastpath/callpath.py``, compiled or interpreted) when what it relies
on goes away under it: a segment closed by a finalize while a call settles, an allocation
that fails inside a claimed call. Each must end the call with an error that says what
happened, never crash the interpreter or leave the call claimed.

Each case crashed (SIGSEGV) or hung before its fix, so the cases that could crash run in
child processes.
"""
from __future__ import annotations

import linecache
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from pycoll import fastpath
from pycoll.fastpath import compiled
from pycoll.runtime.work import Executor, Work
from pycoll.testing import run_ranks

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not fastpath.probe_limit(),
                                 reason="the fast path needs numba on Linux x86-64/aarch64")]

def _closed_while_settling(comm, folder):
    """A one-way broadcast from rank 0 that rank 1 comes to late, then an allreduce whose
    settle on rank 0 sleeps and returns after a finalize on another thread closed the
    segment (done here inside the settle, deterministically). Rank 1 publishes its stage of
    the broadcast only once rank 0 is inside ``FastPath.settle``: on the compiled path the
    settle's first wait runs in the kernel's cfunc, which goes on in ``FastPath.settle``
    only after a sleep slice without progress; however slow the host, rank 0 gets there
    before rank 1 publishes."""
    from pycoll.fastpath import compiled as here
    from pycoll.testing import wait_for_path
    fast, r = comm._fast, comm.rank
    entered = os.path.join(folder, "settling")
    a, b = np.ones(8, np.float32), np.ones(4, np.float32)
    for _ in range(3):                 # bound: the C object where it is built
        comm.allreduce(a)
        comm.broadcast(b, 0)
        comm.allreduce(a)
    bound = type(fast.last_allreduce[3].run).__name__
    settle = fast.settle
    closed: list = []

    def settle_then_close(deadline):
        if r == 0:
            open(entered, "w").close()
        settle(deadline)
        fast.close()
        closed.append(r)

    fast.settle = settle_then_close
    if r == 1:
        wait_for_path(entered, 60, "rank 0's settle of the broadcast in FastPath.settle")
    comm.broadcast(b, 0)               # one-way: the allreduce after it settles first
    a[:] = 1
    out = {"compiled": here.callpath.COMPILED, "bound": bound, "rank": r}
    for key in ("raised", "next"):
        try:
            comm.allreduce(a)
            out[key] = f"returned {a[0]}"
        except Exception as e:         # noqa: BLE001 - the test reads it
            out[key] = f"{type(e).__name__}: {e}"
        if r == 1:
            break                      # rank 0 does not come to a next call
    out["closed"] = closed
    return out


def _is_closed_error(text: str, rank: int) -> bool:
    return (text.startswith(f"PycollError: rank {rank}: allreduce #")
            and "segment is closed (communicator finalized)" in text)


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_a_segment_closed_while_a_call_settles_fails_that_call(monkeypatch, tmp_path, path):
    """A call refuses to run its kernel on a segment closed while it settled (it crashed),
    compiled or not. Where compiled, the first wait of a settle runs in the kernel's cfunc:
    rank 1, late, settles there without ``FastPath.settle`` (which closes here), and its
    allreduce fails because rank 0's did."""
    if path == "compiled" and not compiled.callpath.COMPILED:
        pytest.skip(f"the compiled call path is not built here: {compiled.unavailable}")
    if path == "python":
        monkeypatch.setenv("PYCOLL_FASTPATH_C", "0")
    else:
        monkeypatch.delenv("PYCOLL_FASTPATH_C", raising=False)
    out = run_ranks(_closed_while_settling, 2, str(tmp_path), start_method="spawn",
                    timeout=150)
    for o in out:
        assert o["compiled"] == (path == "compiled"), o
        assert o["bound"] == ("BoundCall" if path == "compiled" else "method"), o
    zero, one = out
    assert zero["closed"] == [0], zero        # its settle slept, went on in Python, closed
    assert _is_closed_error(zero["raised"], 0), zero
    if path == "python":
        assert one["closed"] == [1] and _is_closed_error(one["raised"], 1), one
    else:
        assert one["closed"] == [] and not one["raised"].startswith("returned"), one


_OUT_OF_MEMORY_AFTER_THE_KERNEL = """
import os, threading, numpy as np, _testcapi, pycoll
comm = pycoll.init()
fast, ex = comm._fast, comm._exec
a = np.ones(8, np.float32)
for _ in range(3):
    comm.allreduce(a, "avg")            # avg: the kernel's status goes to Python (``after``)
run = fast.last_allreduce[3].run
err = None
if comm.rank == 0:
    _testcapi.set_nomemory(1, 2)        # the second allocation from here fails
try:
    run(a, None, False, a)
except BaseException as e:
    err = e
finally:
    _testcapi.remove_mem_hooks()
done = threading.Event()
def follow_up():
    try:
        comm.allreduce(a, "avg")
    except Exception:
        pass
    done.set()
threading.Thread(target=follow_up, daemon=True).start()
finished = done.wait(20)              # the follow-up ended (refused or aborted), then:
os.write(1, (f"{comm.rank} {type(err).__name__} {ex.idle.locked()} {finished}" + "\\n").encode())
os._exit(0)
"""


@pytest.mark.parametrize("path", ["compiled", "python"])
def test_an_allocation_that_fails_inside_the_call_ends_the_call(tmp_path, path):
    """An allocation that fails once the call claimed the execution (its flight record, the
    numbers handed to ``after``) must still end the call (failed), or the run lock stays
    held and every later call on the communicator hangs."""
    if path == "compiled" and not compiled.callpath.COMPILED:
        pytest.skip(f"the compiled call path is not built here: {compiled.unavailable}")
    pytest.importorskip("_testcapi")
    script = tmp_path / "oom.py"
    script.write_text(_OUT_OF_MEMORY_AFTER_THE_KERNEL)
    env = dict(os.environ, PYCOLL_FASTPATH_C="0" if path == "python" else "1")
    r = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "2", str(script)],
                       capture_output=True, text=True, timeout=150, env=env)
    lines = sorted(line.split() for line in r.stdout.splitlines() if line[:2] in ("0 ", "1 "))
    assert len(lines) == 2, (r.returncode, r.stdout, r.stderr[-3000:])
    # rank 0's call failed and was ended; its follow-up is refused (a failed communicator).
    # Rank 1's call completed (the allocation failed after rank 0's kernel ran) or was
    # aborted (before it), and its follow-up aborted: neither hangs, no call stays claimed
    assert lines[0] == ["0", "MemoryError", "False", "True"], (lines, r.stderr[-3000:])
    assert lines[1][0] == "1" and lines[1][1] in ("NoneType", "Aborted"), lines
    assert lines[1][2:] == ["False", "True"], (lines, r.stderr[-3000:])


def test_a_worker_that_finds_its_queue_failed_by_close_stops_quietly():
    """``close`` fails the queued calls while the worker waits for the run lock (a call of
    the caller's thread holds it): the worker must find the queue empty and stop, not die
    on an empty deque."""
    ex = Executor("close-race")
    errors: list = []
    hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        lock = ex.idle()
        lock.acquire()                          # an inline call runs
        work = Work("allreduce", 7, 0)
        ran: list = []
        ex.submit(lambda: ran.append(1), work)  # the worker starts, waits for the lock
        for _ in range(1000):                   # until the worker waits for the lock
            frame = sys._current_frames().get(ex.thread.ident) if ex.thread else None
            if frame is not None and frame.f_code.co_name == "_loop" and "_run_lock" in (
                    linecache.getline(frame.f_code.co_filename, frame.f_lineno)):
                break
            threading.Event().wait(0.01)
        else:
            pytest.fail("the worker never came to wait for the run lock")
        ex.close(timeout=0.2)                   # fails the queued call, worker still waits
        lock.release()
        ex.thread.join(10)
        assert not ex.thread.is_alive()
    finally:
        threading.excepthook = hook
    assert errors == [] and ran == [], (errors, ran)
    with pytest.raises(Exception, match="still queued"):
        work.wait()
