"""A window that this process maps (``Communicator.allocate_window`` over shm, and every
rank's own window): ``put`` and ``get`` are one copy here, without a call down to the
transport.

``Window.put`` / ``get`` hand the copy to ``MappedWindow`` first, which takes it when the
array is the common case (a C-contiguous numpy array of the window's very dtype, an offset
that fits, a target that has not released its window) and otherwise declines, so that the
transport's path makes the checks and the errors. Compiled by setup.py (Cython's pure-Python
mode, ``mapped.pxd``; the arrays read through numpy's own header) the whole copy is a few
dozen instructions and a ``memcpy``; interpreted, it is a numpy slice assignment. Why the
copy needs no lock: docs/windows.md#allocated-windows.
"""
from __future__ import annotations

from typing import Any

import numpy as np

try:
    import cython
except ImportError:         # interpreted, and Cython is not installed
    from ..runtime import nocython as cython

#: whether this module runs compiled
COMPILED: bool = cython.compiled

_ndarray = np.ndarray
#: the copies that release the GIL (a large one lets the rank's other threads run)
NOGIL_BYTES = 1 << 16

if not cython.compiled:     # what mapped.pxd declares from C (compiled only)
    PyArrayObject = NPY_ARRAY_C_CONTIGUOUS = NPY_ARRAY_CARRAY = None

    def _compiled_only(*args: Any) -> Any:
        raise AssertionError("compiled only")

    PyArray_NDIM = PyArray_DIM = PyArray_DESCR = PyArray_DATA = PyArray_CHKFLAGS = \
        memcpy = _compiled_only


class MappedWindow:
    """One target's window as this process maps it: ``array`` (1-D, the window's dtype) and
    ``flags``, whose ``[1]`` (the control page's closed word) the target sets when it
    releases the window; both keep the mapping alive while this object lives."""

    def __init__(self, array: np.ndarray, flags: Any) -> None:
        self.array = array
        self.flags = flags
        self.count = array.size
        self.itemsize = array.itemsize
        self.descr = array.dtype
        self.base = array.ctypes.data
        self.closed_at = np.asarray(flags).ctypes.data + 8

    def _size(self, a: Any) -> Any:
        """The element count of ``a`` (an ndarray) from its dimensions."""
        n = 1
        for i in range(PyArray_NDIM(a)):
            n *= PyArray_DIM(a, i)
        return n

    def _copy(self, arr: Any, offset: Any, flags: Any, into: Any) -> Any:
        """Compiled only: the ``memcpy`` between ``arr`` and the window at element
        ``offset`` (already checked to lie in it), ``into`` the window or out of it; False
        where ``arr`` is not a numpy array of the window's dtype with ``flags``, does not
        fit, or the target released the window."""
        if type(arr) is not _ndarray:
            return False
        a = cython.cast(cython.pointer(PyArrayObject), arr)
        if (PyArray_DESCR(a) != cython.cast(cython.p_void, self.descr)
                or not PyArray_CHKFLAGS(a, flags)):
            return False
        at = offset
        n = self._size(a)
        if at + n > self.count or cython.cast(cython.pointer(cython.ulonglong),
                                               self.closed_at)[0]:
            return False
        nbytes = n * self.itemsize
        here = PyArray_DATA(a)
        there = cython.cast(cython.p_void, self.base + at * self.itemsize)
        to, source = (there, here) if into else (here, there)
        if nbytes >= NOGIL_BYTES:
            with cython.nogil:
                memcpy(to, source, nbytes)
        else:
            memcpy(to, source, nbytes)
        return True

    def put(self, src: Any, offset: Any) -> bool:
        """Copy ``src`` into the window at element ``offset``; False (nothing done) where it
        is not the common case."""
        if type(offset) is not int or not 0 <= offset <= self.count:
            return False
        if cython.compiled:
            return self._copy(src, offset, NPY_ARRAY_C_CONTIGUOUS, True)
        if (type(src) is not _ndarray or src.dtype is not self.descr
                or not src.flags.c_contiguous or offset + src.size > self.count
                or self.flags[1]):
            return False
        self.array[offset:offset + src.size] = src if src.ndim == 1 else src.reshape(-1)
        return True

    def get(self, dst: Any, offset: Any) -> bool:
        """Copy the window's elements from ``offset`` into ``dst``; False (nothing done)
        where it is not the common case."""
        if type(offset) is not int or not 0 <= offset <= self.count:
            return False
        if cython.compiled:
            return self._copy(dst, offset, NPY_ARRAY_CARRAY, False)
        if (type(dst) is not _ndarray or dst.dtype is not self.descr
                or not dst.flags.c_contiguous or not dst.flags.writeable
                or offset + dst.size > self.count or self.flags[1]):
            return False
        there = self.array[offset:offset + dst.size]
        dst[...] = there if dst.ndim == 1 else there.reshape(dst.shape)
        return True
