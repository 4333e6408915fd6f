# The compiled form of callpath.py (Cython's pure-Python mode: the .py is the one source,
# this file types it; setup.py builds it where Cython and a C compiler are found).
cimport cython
from libc.stdint cimport int64_t

from pycoll.runtime.state cimport ExecutionState

from pycoll.runtime.ndarray cimport (
    NPY_ARRAY_CARRAY,
    PyArray_CHKFLAGS,
    PyArray_DATA,
    PyArray_DESCR,
    PyArray_DIM,
    PyArray_NDIM,
    PyArrayObject,
    array_p,
)

# a bound kernel's C entry point (kernels.bound_cfunc): data address, bytes, constants
# address, stage, sequence word -> status
ctypedef int64_t (*kernel_fn)(int64_t, int64_t, int64_t, int64_t, int64_t) noexcept nogil


cdef class FastPathState:
    cdef public object slots
    cdef public long long k
    cdef public bint unsettled
    cdef public object pending_call, settling_call
    cdef public tuple last_allreduce, last_broadcast
    cdef public dict host_calls
    cdef public object barrier_call, barrier_buffer
    cdef public ExecutionState execution


@cython.final
cdef class BoundCall:
    cdef readonly FastPathState fast
    cdef readonly ExecutionState execution
    cdef readonly object call, info, entry_name, entry_dtype, entry, descr
    cdef readonly long long seq_bits, later_stages, constants, nbytes
    cdef readonly Py_ssize_t count
    cdef readonly bint one_way, more, bound, raw, entry_raw, direct
    cdef readonly tuple keep
    cdef kernel_fn kernel, settle_kernel

    @cython.locals(fast=FastPathState, execution=ExecutionState, word=cython.longlong,
                   k=cython.longlong, state=cython.longlong)
    cpdef run(self, arr, timeout, async_op, output)
    cdef bint _exact(self, arr)
    @cython.locals(data=cython.longlong, state=cython.longlong)
    cdef Py_ssize_t _kernel(self, arr, long long k, long long word) except? -1
    @cython.locals(state=cython.longlong, constants=cython.longlong)
    cdef _settle(self)
    cpdef after(self, arr, long long state, long long k, long long word)


@cython.locals(a=array_p, length=Py_ssize_t, last=tuple)
cdef object _known(FastPathState fast, bint allreduce, key, arr)

cdef object _run(run, arr, timeout, async_op, output)
