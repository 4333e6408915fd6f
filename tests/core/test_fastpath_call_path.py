"""The call path (``pycoll/fastpath/callpath.py``) compiled against the same source
interpreted.

The same workload runs twice in fresh interpreters (spawned ranks): once as installed (the
module compiled by Cython, where setup.py built it) and once with ``PYCOLL_FASTPATH_C=0``
(the same source interpreted, the path of an install without Cython or a C compiler). The
results, the sequence numbers, the stages, the flight records and the errors must be the
same. The workload covers what the compiled branches take (small allreduces of every native
dtype and op, one-way broadcasts from every root, barriers: the kernels called through
their cfuncs) and what goes on in Python (avg's scale, a float16 reduction numpy does, async
calls, timeouts, queued calls, a settle that sleeps, views the cfunc must not read, a call
the ranks disagree about), and that a barrier or an allreduce right after a one-way
broadcast settles it through the settle's cfunc.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig

import numpy as np
import pytest

from pycoll import fastpath
from pycoll.fastpath import compiled
from pycoll.testing import run_ranks

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not fastpath.probe_limit(),
                                 reason="the fast path needs numba on Linux x86-64/aarch64")]


def _workload(comm, folder):
    import time

    from pycoll.fastpath import compiled as here
    from pycoll.runtime.flight_recorder import SEQ, STATE
    from pycoll.testing import wait_for_path
    fast = comm._fast
    assert fast is not None
    r, n = comm.rank, comm.size
    out: dict = {"compiled": here.callpath.COMPILED}
    results = []
    for dtype in ("float32", "float64", "int32", "int64", "int8", "uint8", "float16"):
        for op in ("sum", "prod", "min", "max", "avg"):
            if op == "avg" and not dtype.startswith("float"):
                continue
            for count in (1, 7, 64):
                a = ((np.arange(count) * 3 + r * 5 + 1) % 7 + 1).astype(dtype)
                for _ in range(3):        # the first call classifies, the others are bound
                    b = a.copy()
                    comm.allreduce(b, op)
                results.append(b.tobytes())
    for root in range(n):
        for dtype, count in (("float32", 3), ("int64", 5), ("uint8", 1000)):
            for i in range(3):
                b = np.full(count, r * 10 + i, dtype=dtype)
                comm.broadcast(b, root)
                results.append(b.tobytes())
        comm.barrier()
    # calls that ``launch`` runs (chunked allreduce, single-copy broadcast), which the
    # methods find and run as the others
    for _ in range(3):
        big = (np.arange(80_000) % 13 + r).astype(np.float32)      # 320 KB: chunked
        comm.allreduce(big)
        wide = np.full(8192, r + 7, np.float32)                    # 32 KB: a single copy
        comm.broadcast(wide, n - 1)
        results += [big.tobytes(), wide.tobytes()]
    # a one-way broadcast, then at once an allreduce: it settles the broadcast first
    b = np.full(4, r, np.float32)
    comm.broadcast(b, n - 1)
    c = np.full(4, r + 1, np.float32)
    comm.allreduce(c)
    results += [b.tobytes(), c.tobytes()]
    # one-way broadcasts, each followed at once by a barrier or an allreduce, which settles
    # it first: the compiled path in C (``kernels.settle_bound``), the Python one through
    # ``FastPath.settle``; and a settle that sleeps (the last rank comes to a broadcast
    # only once rank 0's settle of it went on in ``FastPath.settle``, which on the compiled
    # path takes a sleep slice without progress in the cfunc first)
    settles: list = []
    settle = fast.settle
    entered = os.path.join(folder, "settling")
    late = False

    def counted(deadline):
        settles.append(deadline)
        if late and r == 0:
            open(entered, "w").close()
        return settle(deadline)

    fast.settle = counted
    for i in range(20):
        b = np.full(4, r + i, np.float32)
        comm.broadcast(b, i % n)
        time.sleep(0.005)       # the peer's stage is most likely published: a settle in C
        if i % 2:
            comm.barrier()
        else:
            c = np.full(4, r + i, np.float32)
            comm.allreduce(c)
            results.append(c.tobytes())
        results.append(b.tobytes())
    out["quick_settles"] = len(settles)
    late = True
    if r == n - 1:
        wait_for_path(entered, 60, "rank 0's settle of the broadcast in FastPath.settle")
    b = np.full(4, r, np.float32)
    comm.broadcast(b, 0)
    comm.barrier()
    results.append(b.tobytes())
    out["late_settles"] = len(settles) - out["quick_settles"]
    del fast.settle
    # what the compiled path hands back: async, timeout=, a queued call, other arrays
    a = np.ones(8, np.float32)
    comm.allreduce(a)
    work = comm.allreduce(a, async_op=True)
    comm.allreduce(a)                             # queued behind the async one
    work.wait()
    comm.allreduce(a, timeout=20)
    unaligned = np.frombuffer(bytearray(33), np.float32, count=8, offset=1)
    unaligned[:] = r + 1                          # 8 elements at an odd address
    comm.allreduce(unaligned)
    results += [a.tobytes(), unaligned.tobytes()]
    frozen = np.ones(8, np.float32)
    frozen.flags.writeable = False
    for name, bad in (("frozen", frozen), ("strided", np.ones(16, np.float32)[::2])):
        try:
            comm.allreduce(bad)
            out[name] = "accepted"
        except Exception as e:                    # noqa: BLE001 - compared across paths
            out[name] = type(e).__name__
    # the calls' numbering, stages and flight records
    out["seq"] = comm._exec.seq
    out["stages"] = fast.k
    recorder = comm._exec.recorder
    records = [rec for rec in recorder.ring if rec is not None]
    out["records"] = sorted((rec[SEQ], rec[STATE]) for rec in records)[-40:]
    out["bound"] = type(fast.last_allreduce[3].run).__name__
    out["results"] = results
    # a call the ranks disagree about: every rank raises the same kind of error
    d = np.ones(4 if r == 0 else 5, np.float32)
    comm.allreduce(np.ones(4, np.float32))
    comm.allreduce(np.ones(5, np.float32))
    try:
        comm.allreduce(d)
        out["mismatch"] = "none"
    except Exception as e:                        # noqa: BLE001 - compared across paths
        out["mismatch"] = type(e).__name__
    return out


def _run(folder) -> list:
    os.makedirs(folder)
    return run_ranks(_workload, 2, str(folder), start_method="spawn", timeout=150)


@pytest.mark.skipif(not compiled.callpath.COMPILED,
                    reason=f"the compiled call path is not built here: {compiled.unavailable}")
def test_the_compiled_call_path_does_what_the_python_one_does(monkeypatch, tmp_path):
    # the spawned interpreters decide when they import pycoll, before run_ranks' ``env``
    # reaches them: the variable goes into the environment they start with
    monkeypatch.delenv("PYCOLL_FASTPATH_C", raising=False)
    c_path = _run(tmp_path / "compiled")
    monkeypatch.setenv("PYCOLL_FASTPATH_C", "0")
    python = _run(tmp_path / "python")
    for rank, (c, p) in enumerate(zip(c_path, python)):
        assert c["compiled"] and not p["compiled"], rank
        assert c["bound"] == "BoundCall" and p["bound"] == "method", (c["bound"], p["bound"])
        assert c["results"] == p["results"], rank
        for key in ("seq", "stages", "records", "frozen", "strided", "mismatch"):
            assert c[key] == p[key], (rank, key, c[key], p[key])
    # every settle right after its broadcast: in C on the compiled path, in Python on the
    # other. A rank more than a sleep slice late sends that settle to Python on the compiled
    # path too (a loaded host deschedules ranks for whole time slices): fewer than all of
    # them, not none
    for rank, (c, p) in enumerate(zip(c_path, python)):
        assert c["quick_settles"] < 20 and p["quick_settles"] == 20, (rank, c, p)
    # the late broadcast's settle sleeps on rank 0 and goes on in Python either way
    assert c_path[0]["late_settles"] == 1 and python[0]["late_settles"] == 1, (c_path, python)
    assert c_path[0]["mismatch"] == "CollectiveMismatch"
    assert c_path[0]["frozen"] != "accepted" and c_path[0]["strided"] == "InvalidArgument"
    assert c_path[0]["results"] == c_path[1]["results"]


def test_the_compiled_call_path_is_built_where_a_compiler_is():
    """An install that could build it and did not (a broken build, numpy's array layout
    changed) says why here instead of running a microsecond slower per call unnoticed."""
    include = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not (shutil.which(os.environ.get("CC", "cc")) and os.path.exists(include)):
        pytest.skip("no C compiler or no Python headers here: the Python call path is the "
                    "expected one")
    if os.environ.get("PYCOLL_FASTPATH_C") == "0":
        pytest.skip("PYCOLL_FASTPATH_C=0 turns it off")
    if not compiled.callpath.COMPILED and importlib.util.find_spec("Cython") is None:
        pytest.skip("Cython is not installed here: an in-place build could not compile it "
                    "(pip install cython; pip install . brings it as a build requirement)")
    assert compiled.callpath.COMPILED, compiled.unavailable


_CFUNCS_LOADED = """
from pycoll.fastpath import kernels
made = [kernels.bound_cfunc(name, dtype) for name, dtype in
        (("allreduce_bound", "float32"), ("broadcast_bound", "uint8"),
         ("settle_bound", "uint8"))]
print(*(f.cache_hits for f in made))
"""


def test_the_compiled_entry_points_load_from_numba_cache_in_a_new_process():
    """Numba keys its on-disk cache on the pickled closure of what it compiles: a kernel in
    the closure pickles differently in every process, which made every process compile the
    entry points again (~0.3 s at its first call) and add an entry to the cache's index (a
    cache of 250 MB after a few thousand runs). The second of two fresh processes must load
    all three from the cache."""
    pytest.importorskip("numba")
    import subprocess
    import sys
    runs = [subprocess.run([sys.executable, "-c", _CFUNCS_LOADED], capture_output=True,
                           text=True, timeout=150) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    assert runs[1].stdout.split() == ["1", "1", "1"], (runs[0].stdout, runs[1].stdout)


_NOT_BUILT = """
import importlib.util, os, sys
class NotBuilt:
    \"\"\"An install whose call path did not compile: its modules are found as source.\"\"\"
    def find_spec(self, name, path=None, target=None):
        if name in ("pycoll.fastpath.callpath", "pycoll.runtime.state") and path:
            source = os.path.join(path[0], name.rpartition(".")[2] + ".py")
            return importlib.util.spec_from_file_location(name, source)
        return None
sys.meta_path.insert(0, NotBuilt())
"""

_ONE_CALL = """
import numpy as np
import pycoll
comm = pycoll.init()
a = np.ones(2, np.float32)
comm.allreduce(a)
print(comm.rank, "returned", a[0], comm.selected_algorithm("allreduce", 8))
pycoll.finalize()
"""


@pytest.mark.parametrize("chosen", [False, True])
def test_an_install_without_the_compiled_call_path_says_so_once(tmp_path, chosen):
    """pip shows setup.py's warning only with -v: a job whose install did not compile
    ``callpath`` warns once, in one line, and runs; ``PYCOLL_FASTPATH_C=0`` (the Python
    path chosen) does not warn."""
    import subprocess
    import sys
    (tmp_path / "sitecustomize.py").write_text(_NOT_BUILT)
    script = tmp_path / "one_call.py"
    script.write_text(_ONE_CALL)
    env = {k: v for k, v in os.environ.items() if k != "PYCOLL_FASTPATH_C"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path),
                                                      os.environ.get("PYTHONPATH")]))
    if chosen:
        env["PYCOLL_FASTPATH_C"] = "0"
    r = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "2", str(script)],
                       capture_output=True, text=True, timeout=150, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    assert sorted(r.stdout.split("\n"))[1:] == ["0 returned 2.0 fastpath",
                                               "1 returned 2.0 fastpath"], r.stdout
    warned = [line for line in r.stderr.splitlines() if "run their Python path" in line]
    if chosen:
        assert warned == [], r.stderr
    else:
        assert len(warned) == 1 and "is not built (" in warned[0], r.stderr
