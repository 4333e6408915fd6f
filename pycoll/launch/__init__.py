"""Launching pycoll jobs: the ``python -m pycoll.run`` launcher and launch-environment detection.

* :func:`launch` runs N local ranks with a rendezvous store (the Python API of
  ``python -m pycoll.run``).
* :func:`detect_launch` / :func:`resolve_launch` tell a process its rank, world size and store
  address from the environment of pycoll.run, torchrun, Open MPI, MPICH/Hydra or Slurm.

Importing this package is cheap: standard library only; ``rendezvous`` is imported when
:func:`launch` runs.
"""

import importlib
from typing import Any

from .environment import DEFAULT_MASTER_PORT, LAUNCHERS, LaunchInfo, detect_launch, resolve_launch

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover
    from .launcher import EXIT_TIMEOUT, launch

# The launcher (subprocess, signals, threads) loads on first use, so that pycoll.init(),
# which only needs detect_launch, does not pay for it.
def __getattr__(name: str) -> Any:     # PEP 562
    if name in ("launch", "EXIT_TIMEOUT"):
        return getattr(importlib.import_module(f"{__name__}.launcher"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "launch",
    "detect_launch",
    "resolve_launch",
    "LaunchInfo",
    "DEFAULT_MASTER_PORT",
    "LAUNCHERS",
    "EXIT_TIMEOUT",
]
