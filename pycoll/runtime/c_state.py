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
from ..errors import InvalidArgument


def _compiled_call_off() -> str:
    """Why ``PYCOLL_FASTPATH_C`` turns the compiled call off ('' : it does not). Read once, at
    import: it picks classes (this module's and ``fastpath.compiled``'s). A bad value turns
    the compiled call off rather than break ``import pycoll``; ``fastpath.probe_record``
    raises it when a communicator is made."""
    try:
        return "" if env_bool("PYCOLL_FASTPATH_C", True) else "PYCOLL_FASTPATH_C=0"
    except InvalidArgument as e:
        return str(e)


#: why the compiled call is off by ``PYCOLL_FASTPATH_C`` ('' : it is not)
COMPILED_CALL_OFF = _compiled_call_off()


def _load() -> tuple[Any, Any]:
    if COMPILED_CALL_OFF:
        return object, object
    try:
        module = importlib.import_module("pycoll.runtime._execution_state")
        return module.ExecutionState, module.RecorderState
    except (ImportError, AttributeError):   # not built, or a build older than this source
        return object, object


#: ``Execution``'s base and ``FlightRecorder``'s (both ``object`` without the C module)
ExecutionState, RecorderState = _load()
