"""The compiled call path: ``_callpath.BoundCall``, a fast call's Python path in C.

``FastPath.bind`` makes every small fast call (one slot, or a one-way broadcast) a closure
that claims the execution, numbers the call, records it, and calls the kernel's numba entry
point. On the 2-vCPU machine that Python costs more than the kernel. Where setup.py built
``_callpath`` (a C compiler was found at install), ``bind`` wraps the closure in a
``BoundCall``. The BoundCall does the closure's work through the C API and calls the kernel
through a numba ``cfunc`` (``kernels.bound_cfunc``), and hands everything else back to the
closure. Measurements: docs/algorithms.md#the-compiled-call-path.

``PYCOLL_FASTPATH_C=0`` turns it off (the closure alone, as without a compiler). It is the
one variable read at ``import pycoll`` (``runtime.execution.COMPILED_CALL_OFF``).
"""
from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from ..runtime.execution import COMPILED_CALL_OFF, ExecutionState


def _load() -> tuple[Any, str]:
    """The ``_callpath`` module, or None and why: not built, turned off, or it does not read
    numpy's arrays as this numpy lays them out (``_reads_numpy``)."""
    if COMPILED_CALL_OFF:
        return None, COMPILED_CALL_OFF
    try:
        _callpath = importlib.import_module("pycoll.fastpath._callpath")
    except ImportError as e:
        return None, (f"not built ({e}): reinstall pycoll where a C compiler and Python's "
                      "headers are found (docs/troubleshooting.md#the-compiled-call-path)")
    _callpath.use_ndarray(np.ndarray)
    if not _reads_numpy(_callpath):
        return None, f"it does not read numpy {np.__version__}'s arrays as numpy does"
    if ExecutionState is object:
        return None, ("pycoll/runtime/_execution_state.c, which it reads the execution's "
                      "fields from, is not built")
    fields = importlib.import_module("pycoll.runtime._execution_state").offsets
    _callpath.use_execution_state(ExecutionState, fields)
    return _callpath, ""


def _reads_numpy(module: Any) -> bool:
    """Whether ``module`` reads an array's data address, dimensions, flags and dtype as
    numpy itself reports them (the C code mirrors numpy's array struct: checked here once,
    on arrays that must and must not take the compiled path)."""
    base = np.zeros(6, dtype=np.float32)
    frozen = base[:4]
    frozen.flags.writeable = False
    behaved = 0x0001 | 0x0100 | 0x0400      # C-contiguous, aligned, writeable
    for arr in (base, base[1:], base[::2], frozen, np.zeros((2, 3)), np.zeros(5, np.int64)):
        data, nd, first, flags, descr = module.array_fields(arr)
        c_ok = (flags & behaved) == behaved
        if (data != arr.ctypes.data or nd != arr.ndim or first != arr.shape[0]
                or descr is not arr.dtype
                or c_ok != (arr.flags.c_contiguous and arr.flags.aligned
                            and arr.flags.writeable)):
            return False
    return True


#: ``_callpath``, or None; and why it is None (see ``_load``)
callpath, unavailable = _load()
#: ``_callpath.enter(fast, broadcast, tensor, op or root, timeout, async_op)``: the call of
#: the previous call's kind on ``tensor``, or NotImplemented (``Collectives.allreduce``)
enter = callpath.enter if callpath is not None else None
#: ``_callpath.FastMethod(func, kind)``: ``Communicator.allreduce`` (``broadcast``,
#: ``barrier``) in C in front of its Python method ``func``, or None
FastMethod = callpath.FastMethod if callpath is not None else None
#: ``FastPath``'s base: the attributes a call changes (stages, settling, the previous call's
#: kind), kept where the C code reads them directly; a plain object without ``_callpath``
FastPathState: Any = callpath.FastPathState if callpath is not None else object
