"""Shared test setup.

Ranks are forked from the pytest process (``pycoll.testing.run_ranks``), so importing the
heavy optional modules once here saves every forked rank from importing them again.
"""
try:
    import torch  # noqa: F401  (float16/bfloat16 reductions use torch's kernels)
except ImportError:
    pass
