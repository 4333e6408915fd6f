"""Device-memory tests run on a GPU where CuPy sees one, and on pycoll's CPU simulator of
CUDA everywhere else (``pycoll.testing.cuda_env``), so every CI run goes through the CUDA
code paths. A pass on the simulator is never a pass on a GPU."""
from __future__ import annotations

import pytest

from pycoll.testing import cuda_env


@pytest.fixture(autouse=True)
def device_runtime(monkeypatch):
    """This process and the ranks it starts use the same device runtime."""
    env = cuda_env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env
