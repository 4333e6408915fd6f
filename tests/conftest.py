"""Shared test setup.

Ranks are forked from the pytest process (``pycoll.testing.run_ranks``), so importing the
heavy optional modules once here saves every forked rank from importing them again.
"""
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
