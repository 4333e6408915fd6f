# numpy's array object as the compiled modules read it (fastpath/callpath.pxd,
# comm/mapped.pxd): through numpy's own header and its inline accessors only, no
# import_array and no C API table, so a module runs on any numpy whose array struct is the
# one it was built against (numpy keeps it for its ABI: 1.7 to 2.x alike). Declarations
# only: there is no module of this name.
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
