"""The fast call paths (the C ``BoundCall`` and the Python closure of ``FastPath.bind``)
when what they rely on goes away under them: a segment closed by a finalize while a call
settles, an allocation that fails after the kernel ran, a deleted state field, objects that
are not what the C code reads. Each must end the call with an error that says what happened
(or take the Python way), never crash the interpreter or leave the call claimed.

Found by a review of the C call path on 2026-11-28; each case crashed (SIGSEGV) or hung
before its fix. The cases that could crash run in child processes.
"""
from __future__ import annotations

import linecache
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

needs_c = pytest.mark.skipif(compiled.callpath is None,
                             reason=f"the compiled call path is not built here: "
                                    f"{compiled.unavailable}")


def _closed_while_settling(comm):
    """A one-way broadcast from rank 0 that rank 1 comes to 0.3 s late, then an allreduce
    whose settle on rank 0 sleeps (so it goes on in ``FastPath.settle`` on both paths) and
    returns after a finalize on another thread closed the segment (done here inside the
    settle, deterministically)."""
    import time

    from pycoll.fastpath import compiled as here
    fast, r = comm._fast, comm.rank
    a, b = np.ones(8, np.float32), np.ones(4, np.float32)
    for _ in range(3):                 # bound: the C object where it is built
        comm.allreduce(a)
        comm.broadcast(b, 0)
        comm.allreduce(a)
    bound = type(fast.last_allreduce[3].run).__name__
    settle = fast.settle
    closed: list = []

    def settle_then_close(deadline):
        settle(deadline)
        fast.close()
        closed.append(r)

    fast.settle = settle_then_close
    if r == 1:
        time.sleep(0.3)
    comm.broadcast(b, 0)               # one-way: the allreduce after it settles first
    a[:] = 1
    out = {"compiled": here.callpath is not None, "bound": bound, "rank": r}
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
def test_a_segment_closed_while_a_call_settles_fails_that_call(monkeypatch, path):
    """The Python closure refuses to run its kernel on a closed segment (it crashed); the
    compiled path holds the segment's array across the settle and its kernel, so the call
    that had begun completes on the mapping it holds, and the next one is refused."""
    if path == "compiled" and compiled.callpath is None:
        pytest.skip(f"the compiled call path is not built here: {compiled.unavailable}")
    if path == "python":
        monkeypatch.setenv("PYCOLL_FASTPATH_C", "0")
    else:
        monkeypatch.delenv("PYCOLL_FASTPATH_C", raising=False)
    out = run_ranks(_closed_while_settling, 2, start_method="spawn", timeout=150)
    for o in out:
        assert o["compiled"] == (path == "compiled"), o
        assert o["bound"] == ("BoundCall" if path == "compiled" else "function"), o
    zero, one = out
    assert zero["closed"] == [0], zero        # its settle slept, went on in Python, closed
    if path == "python":
        assert _is_closed_error(zero["raised"], 0), zero
        assert one["closed"] == [1] and _is_closed_error(one["raised"], 1), one
    else:
        assert zero["raised"] == "returned 2.0" and one["raised"] == "returned 2.0", out
        assert _is_closed_error(zero["next"], 0), zero
        assert one["closed"] == [], one       # settled in C: the segment stayed open


_OUT_OF_MEMORY_AFTER_THE_KERNEL = """
import os, threading, numpy as np, _testcapi, pycoll
comm = pycoll.init()
fast, ex = comm._fast, comm._exec
a = np.ones(8, np.float32)
for _ in range(3):
    comm.allreduce(a, "avg")            # avg: the kernel's status goes to Python (``after``)
run = fast.last_allreduce[3].run
assert type(run).__name__ == "BoundCall", run
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


@needs_c
def test_an_allocation_that_fails_after_the_kernel_ends_the_call(tmp_path):
    """The numbers handed to ``after`` are allocated after the kernel ran: when that fails
    the call must still end (failed), or the run lock stays held and every later call on
    the communicator hangs."""
    pytest.importorskip("_testcapi")
    script = tmp_path / "oom.py"
    script.write_text(_OUT_OF_MEMORY_AFTER_THE_KERNEL)
    r = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "2", str(script)],
                       capture_output=True, text=True, timeout=150)
    lines = sorted(line.split() for line in r.stdout.splitlines() if line[:2] in ("0 ", "1 "))
    assert len(lines) == 2, (r.returncode, r.stdout, r.stderr[-3000:])
    # rank 0's call failed and was ended; its follow-up is refused (a failed communicator),
    # rank 1's aborted: neither hangs, and no call is left claimed
    assert lines[0] == ["0", "MemoryError", "False", "True"], (lines, r.stderr[-3000:])
    assert lines[1] == ["1", "NoneType", "False", "True"], (lines, r.stderr[-3000:])


_DELETED_FIELDS = """
import os, sys, numpy as np, pycoll
which = sys.argv[1]
comm = pycoll.init()
fast, ex = comm._fast, comm._exec
a, b = np.ones(8, np.float32), np.ones(4, np.float32)
for _ in range(3):
    comm.allreduce(a)
    comm.broadcast(b, 0)
    comm.allreduce(a)
delattr(ex if which in ("started", "current") else fast, which)
a[:] = 1
try:
    if which == "unsettled":
        comm.broadcast(b, 0)
        comm.allreduce(a)
    else:
        comm.allreduce(a)
    os.write(1, (f"{comm.rank} returned {a[0]}" + "\\n").encode())
except Exception as e:
    os.write(1, (f"{comm.rank} raised {type(e).__name__}" + "\\n").encode())
os._exit(0)
"""


@needs_c
@pytest.mark.parametrize("field", ["started", "current", "unsettled"])
def test_a_deleted_state_field_does_not_crash_the_compiled_path(tmp_path, field):
    """The state's fields are writable attributes (``del`` leaves them NULL): the C path
    replaces them without reading what a deleted one held."""
    script = tmp_path / "fields.py"
    script.write_text(_DELETED_FIELDS)
    r = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "2", str(script), field],
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-3000:])
    lines = sorted(line for line in r.stdout.splitlines() if line[:2] in ("0 ", "1 "))
    assert lines == ["0 returned 2.0", "1 returned 2.0"], (lines, r.stderr[-3000:])


_NOT_WHAT_C_READS = """
import numpy as np
from pycoll.fastpath import compiled
from pycoll.runtime.c_state import ExecutionState, RecorderState
cp = compiled.callpath
for name, call in (("use_ndarray", lambda: cp.use_ndarray(bytearray)),
                   ("use_execution_state",
                    lambda: cp.use_execution_state(object, RecorderState)),
                   ("use_execution_state", lambda: cp.use_execution_state(ExecutionState, int))):
    try:
        call()
        print(name, "accepted a type of another layout")
    except TypeError:
        print(name, "refused")
fast = compiled.FastPathState()
unmade = cp.BoundCall.__new__(cp.BoundCall)     # never initialised: every field NULL
fast.last_allreduce = ("sum", np.dtype(np.float32), 0, type("C", (), {"run": unmade})())
comm = type("Comm", (), {"_fast": fast, "_integrity_every": 0})()
allreduce = cp.FastMethod(lambda comm, tensor, op="sum": print("the Python method"),
                          "allreduce")
try:
    allreduce(comm, np.zeros(0, np.float32))
    print("FastMethod ran an unmade call")
except TypeError:
    print("FastMethod refused")
"""


@needs_c
def test_objects_the_c_code_does_not_know_are_refused():
    """Types of another layout than the headers the module was built against (a stale build
    of one module), and a bound call never initialised, raise TypeError: never a crash."""
    r = subprocess.run([sys.executable, "-c", _NOT_WHAT_C_READS], capture_output=True,
                       text=True, timeout=150)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert r.stdout.split("\n")[:4] == ["use_ndarray refused", "use_execution_state refused",
                                        "use_execution_state refused",
                                        "FastMethod refused"], r.stdout


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
