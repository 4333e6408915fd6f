# The compiled form of mapped.py (Cython's pure-Python mode: the .py is the one source, this
# file types it; setup.py builds it where Cython and a C compiler are found).
cimport cython
from libc.string cimport memcpy

from pycoll.runtime.ndarray cimport (
    NPY_ARRAY_C_CONTIGUOUS,
    NPY_ARRAY_CARRAY,
    PyArray_CHKFLAGS,
    PyArray_DATA,
    PyArray_DESCR,
    PyArray_DIM,
    PyArray_NDIM,
    PyArrayObject,
    array_p,
)

ctypedef void *void_p


@cython.final
cdef class MappedWindow:
    cdef readonly object array, flags, descr
    cdef readonly Py_ssize_t count, itemsize
    cdef readonly size_t base, closed_at

    @cython.locals(n=Py_ssize_t, i=int)
    cdef Py_ssize_t _size(self, array_p a)
    @cython.locals(a=array_p, at=Py_ssize_t, n=Py_ssize_t, nbytes=size_t,
                   here=void_p, there=void_p, to=void_p, source=void_p)
    cdef bint _copy(self, arr, Py_ssize_t offset, int flags, bint into) except -1
    cpdef bint put(self, src, offset) except -1
    cpdef bint get(self, dst, offset) except -1
