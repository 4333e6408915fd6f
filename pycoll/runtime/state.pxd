# The compiled form of state.py (Cython's pure-Python mode: the .py is the one source, this
# file types it). fastpath/callpath.pxd cimports these classes to read their fields
# directly.
cimport cython
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cdef long long _SEQ_MASK, _SEQ_SHIFT

cdef double _now() noexcept


cdef class RecorderState:
    cdef public Py_ssize_t capacity
    cdef public list ring
    cdef public long long count

    @cython.locals(rec=list, i=cython.longlong)
    cpdef list open(self, seq, info, double started=*, int state=*)


cdef class ExecutionState:
    cdef public long long seq
    cdef public double started
    cdef public object current
    cdef public bint _refusing
    cdef public bint generic_ran
    cdef public RecorderState recorder
    cdef public object idle, finish_inline
    cdef object _acquire
    cdef public object queued

    @cython.locals(seq=cython.longlong, start=cython.double, fr=RecorderState)
    cpdef long long begin_inline(self, info, long long bits) except -1
