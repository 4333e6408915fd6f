"""The C bases of ``Execution`` and ``FlightRecorder``: the fields a call changes, in the
structs of ``pycoll/runtime/_execution_state.h``, where the fast path's compiled call reads
them directly (docs/algorithms.md#the-compiled-call-path).

Where setup.py did not build ``_execution_state`` (or ``PYCOLL_FASTPATH_C=0`` turns the
compiled call off) both are ``object``: the classes keep the same attributes in their dict
or slots.
"""
from __future__ import annotations

import importlib
from typing import Any

from ..envvars import env_bool


def _load() -> tuple[Any, Any]:
    if not env_bool("PYCOLL_FASTPATH_C", True):
        return object, object
    try:
        module = importlib.import_module("pycoll.runtime._execution_state")
        return module.ExecutionState, module.RecorderState
    except (ImportError, AttributeError):   # not built, or a build older than this source
        return object, object


#: ``Execution``'s base and ``FlightRecorder``'s (both ``object`` without the C module)
ExecutionState, RecorderState = _load()
