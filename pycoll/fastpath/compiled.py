"""The compiled call path: ``_callpath.BoundCall``, a fast call's Python path in C.

``FastPath.bind`` makes every small fast call (one slot, or a one-way broadcast) a closure
that claims the execution, numbers the call, records it, and calls the kernel's numba entry
point. That Python can cost more than the kernel. Where setup.py built
``_callpath`` (a C compiler was found at install), ``bind`` wraps the closure in a
``BoundCall``. The BoundCall does the closure's work through the C API and calls the kernel
through a numba ``cfunc`` (``kernels.bound_cfunc``), and hands everything else back to the
closure. Measurements: docs/algorithms.md#the-compiled-call-path.

``PYCOLL_FASTPATH_C=0`` turns it off (the closure alone, as without a compiler). It is the
one variable read at ``import pycoll`` (``runtime.c_state.COMPILED_CALL_OFF``).
"""
from __future__ import annotations

import importlib
import warnings
from typing import Any

import numpy as np

from ..runtime.c_state import COMPILED_CALL_OFF, ExecutionState, RecorderState


def _load() -> tuple[Any, str]:
    """The ``_callpath`` module, or None and why: not built, or turned off."""
    if COMPILED_CALL_OFF:
        return None, COMPILED_CALL_OFF
    try:
        _callpath = importlib.import_module("pycoll.fastpath._callpath")
    except ImportError as e:
        return None, (f"not built ({e}): reinstall pycoll where a C compiler and Python's "
                      "headers are found (docs/troubleshooting.md#the-compiled-call-path)")
    if ExecutionState is object:
        return None, ("pycoll/runtime/_execution_state.c, which it reads the execution's "
                      "fields from, is not built")
    try:    # the types its headers describe (a stale build of one module is refused here)
        _callpath.use_ndarray(np.ndarray)
        _callpath.use_execution_state(ExecutionState, RecorderState)
    except TypeError as e:
        return None, f"{e}: reinstall pycoll"
    return _callpath, ""


#: ``_callpath``, or None; and why it is None (see ``_load``)
callpath, unavailable = _load()
#: ``_callpath.FastMethod(func, kind)``: ``Communicator.allreduce`` (``broadcast``,
#: ``barrier``) in C in front of its Python method ``func``, or None
FastMethod = callpath.FastMethod if callpath is not None else None
#: ``FastPath``'s base: the attributes a call changes (stages, settling, the previous call's
#: kind), kept where the C code reads them directly; a plain object without ``_callpath``
FastPathState: Any = callpath.FastPathState if callpath is not None else object


_warned: list[bool] = []


def warn_if_not_built() -> None:
    """One line, once per process, when the install did not build the compiled call path
    (pip shows setup.py's warning only with -v): small fast calls then take about a
    microsecond more each. Not when ``PYCOLL_FASTPATH_C=0`` chose the Python path. Rank 0 of
    a communicator that takes the fast path calls it (``FastPath``)."""
    if callpath is not None or _warned or unavailable == "PYCOLL_FASTPATH_C=0":
        return
    _warned.append(True)
    # explicit, at line 0 of this file: the warning prints as one line (no source line)
    warnings.warn_explicit(f"pycoll: small fast calls run their Python path, about a "
                           f"microsecond slower each: the compiled call path is {unavailable} "
                           "(PYCOLL_FASTPATH_C=0 chooses the Python path and silences this)",
                           RuntimeWarning, __file__, 0, module=__name__)
