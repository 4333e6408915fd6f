"""Shared test setup.

Ranks are forked from the pytest process (``pycoll.testing.run_ranks``), so importing the
heavy optional modules once here saves every forked rank from importing them again.

The session's shared-memory segments get a name prefix of their own (``PYCOLL_SHM_PREFIX``,
inherited by every rank the tests start; one per pytest-xdist worker): other pycoll jobs on
the host then neither sweep the leftovers that tests make on purpose nor are swept by the
tests, and the session sweeps what its dead ranks left when it ends.
"""
import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # each pytest-xdist worker is a session of its own, so it gets its own prefix (the
    # controller's, inherited through the environment, would be shared by the workers)
    os.environ["PYCOLL_SHM_PREFIX"] = f"pycoll-test{os.getpid()}"
else:
    os.environ.setdefault("PYCOLL_SHM_PREFIX", f"pycoll-test{os.getpid()}")

try:
    import torch  # noqa: F401  (float16/bfloat16 reductions use torch's kernels)
except ImportError:
    pass

# The fast path's kernels: compiled (or loaded from numba's cache) once here, so that no
# forked rank compiles while its peers wait under a short test deadline.
try:
    from pycoll import fastpath

    if fastpath.probe_limit():
        fastpath.warm()
except ImportError:
    pass


def pytest_sessionfinish(session, exitstatus):
    from pycoll.transports.shm.segment import sweep
    sweep()
