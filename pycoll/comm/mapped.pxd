# The compiled form of mapped.py (Cython's pure-Python mode: the .py is the one source, this
# file types it; setup.py builds it where Cython and a C compiler are found).
cimport cython
from libc.string cimport memcpy

# numpy's array object through numpy's own header and its inline accessors only (as
# fastpath/callpath.pxd): no import_array, no C API table
cdef extern from "numpy/ndarraytypes.h":
    ctypedef struct PyArrayObject:
        pass
    enum: NPY_ARRAY_CARRAY
    enum: NPY_ARRAY_C_CONTIGUOUS
    int PyArray_NDIM(PyArrayObject *arr) nogil
    Py_ssize_t PyArray_DIM(PyArrayObject *arr, int n) nogil
    void *PyArray_DESCR(PyArrayObject *arr) nogil
    void *PyArray_DATA(PyArrayObject *arr) nogil
    int PyArray_CHKFLAGS(PyArrayObject *arr, int flags) nogil
ctypedef PyArrayObject *array_p
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
