/* The fast path's bound call, compiled: ``FastPath.bind``'s closure as a C callable.

   A small fast call (one slot, or a one-way broadcast) costs its kernel (flags and copies
   between cores) plus the Python around it, which can cost more: claiming the execution,
   numbering, the flight record, the stage counter and the call into numba's entry point.
   This object does that Python's work through the C API, and calls the kernel through the C function
   pointer of a numba ``cfunc`` (``kernels.bound_cfunc``) with the array's data pointer: no
   bytecode, no numba dispatcher. It changes nothing of what a call does: the same
   attributes of the same objects are read and written, in the same order, as in the closure
   (``FastPath.bind``, which stays the one description of a call and runs whatever this does
   not take: an asynchronous call, a timeout, a queued call, a refused communicator, an array
   that is not exactly what the call was bound to). A call right after a one-way broadcast
   settles it first through the cfunc of ``kernels.settle_bound``, and hands a settle that
   slept to ``settle_after`` (``FastPath.settle``'s loop). Whatever the kernel leaves to
   Python (a sleep, a reduction numpy does, avg's scale, leftovers of a generic call) goes to
   ``after``, which also ends the call.

   Optional: pycoll works without it (``pycoll.fastpath.compiled``); setup.py builds it where
   a C compiler is found. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* numpy's array object through numpy's own header and its inline accessors (numpy is a
   build requirement: pyproject.toml). Only those: no ``import_array``, no C API table, so
   the module runs on any numpy whose array struct is the one it was built against (numpy
   keeps it for its ABI: 1.7 to 2.x alike). */
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>

#include "../object_fields.h"
#include "../runtime/_execution_state.h"

typedef int64_t (*kernel_fn)(int64_t data, int64_t nbytes, int64_t constants, int64_t stage,
                             int64_t seq);

/* What a FastPath changes on every call, where C reads it without a lookup: ``FastPath``
   derives from this type when the module is built (``compiled.FastPathState``), so that
   its Python code reads and writes these as ordinary attributes. */
typedef struct {
    PyObject_HEAD
    PyObject *slots;            /* SharedSlots, or None once closed */
    PyObject *k;                /* int: stages run so far */
    PyObject *unsettled;        /* bool: a one-way broadcast may be pending */
    PyObject *pending_call, *settling_call;
    PyObject *last_allreduce, *last_broadcast;
    PyObject *barrier_call;     /* FastCall of the barrier (None until the first one) */
    PyObject *barrier_buffer;   /* the empty array it runs on */
} FastPathState;               /* objects: see ExecutionState (_execution_state.c) */

static PyMemberDef state_members[] = {
    {"slots", T_OBJECT_EX, offsetof(FastPathState, slots), 0, NULL},
    {"k", T_OBJECT_EX, offsetof(FastPathState, k), 0, NULL},
    {"unsettled", T_OBJECT_EX, offsetof(FastPathState, unsettled), 0, NULL},
    {"pending_call", T_OBJECT_EX, offsetof(FastPathState, pending_call), 0, NULL},
    {"settling_call", T_OBJECT_EX, offsetof(FastPathState, settling_call), 0, NULL},
    {"last_allreduce", T_OBJECT_EX, offsetof(FastPathState, last_allreduce), 0, NULL},
    {"last_broadcast", T_OBJECT_EX, offsetof(FastPathState, last_broadcast), 0, NULL},
    {"barrier_call", T_OBJECT_EX, offsetof(FastPathState, barrier_call), 0, NULL},
    {"barrier_buffer", T_OBJECT_EX, offsetof(FastPathState, barrier_buffer), 0, NULL},
    {NULL}
};

static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    FastPathState *f = (FastPathState *)object_fields_new(type, state_members);
    if (f == NULL) return NULL;
    PyObject *k = PyLong_FromLong(0);
    if (k == NULL) {
        Py_DECREF(f);
        return NULL;
    }
    Py_XSETREF(f->k, k);
    Py_XSETREF(f->unsettled, Py_NewRef(Py_False));
    return (PyObject *)f;
}

OBJECT_FIELDS_TYPE(fast_path_state, FastPathState, state_members, state_new,
                   "pycoll.fastpath._callpath.FastPathState",
                   "What a FastPath changes on every call (FastPath derives from it).");

static PyObject *s_run, *s_itemsize;
static PyTypeObject *ndarray_type = NULL;

/* The types of the Execution's and its flight recorder's fields
   (``pycoll/runtime/_execution_state.h``), set once by ``use_execution_state``. */
static PyTypeObject *execution_state_type = NULL, *recorder_state_type = NULL;

/* ``arr`` (an instance of ``ndarray_type``) is what the fast path's bound calls take: 1-D,
   C-contiguous, aligned and writable (``arr.flags.carray``: what ``FastPath.run`` checks). */
static inline int bound_array(PyArrayObject *arr) {
    return PyArray_NDIM(arr) == 1 && PyArray_CHKFLAGS(arr, NPY_ARRAY_CARRAY);
}

/* 0.0, the flight record's unset times (one object for all of them) */
static PyObject *zero = NULL;
static PyObject *s_bytes;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fallback;     /* the closure: the whole call, the Python way */
    PyObject *after;        /* after(arr, state, k, word): the rest of the call, ends it */
    PyObject *settle_after; /* settle_after(state): the rest of a settle that slept */
    PyObject *abort;        /* abort(exc) -> the error to raise (fail_inline) */
    FastPathState *fast;
    PyObject *execution, *call, *info;
    PyObject *acquire, *release, *queued;
    PyObject *recorder, *ring, *completed;
    PyTypeObject *ndarray;
    PyObject *descr;
    Py_ssize_t count, capacity;
    long long nbytes, seq_bits, later_stages, seq_mask, seq_shift, constants;
    int one_way, more;
    kernel_fn kernel;
    kernel_fn settle;       /* settle_bound: the pending one-way broadcast, before kernel */
    PyObject *keep;         /* what owns the kernel's code and the constants' words */
} BoundCall;

/* Number the claimed call and record it: ``Execution.begin_inline`` after its claim. */
static int number(BoundCall *b, long long *seq_out) {
    ExecutionState *ex = (ExecutionState *)b->execution;
    PyObject **seq_at = &ex->seq;
    long long seq = *seq_at != NULL ? PyLong_AsLongLong(*seq_at) : -1;
    if (seq < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the call count is unset");
        return -1;
    }
    seq += 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);        /* time.monotonic() on Linux */
    PyObject *seq_obj = PyLong_FromLongLong(seq);
    PyObject *start = PyFloat_FromDouble((double)ts.tv_sec + ts.tv_nsec * 1e-9);
    if (seq_obj == NULL || start == NULL) {
        Py_XDECREF(seq_obj); Py_XDECREF(start);
        return -1;
    }
    Py_XSETREF(*seq_at, seq_obj);                /* the execution holds them, */
    Py_XSETREF(ex->started, start);
    *seq_out = seq;
    if (b->recorder == Py_None) return 0;
    /* FlightRecorder.open, as begin_inline writes it out (and the record, too) */
    PyObject *rec = PyList_New(7);
    PyObject **count_slot = &((RecorderState *)b->recorder)->count;
    long long i = *count_slot != NULL ? PyLong_AsLongLong(*count_slot) : -1;
    PyObject *next = i >= 0 ? PyLong_FromLongLong(i + 1) : NULL;
    if (rec == NULL || next == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the flight recorder's count is unset");
        Py_XDECREF(rec); Py_XDECREF(next);
        return -1;
    }
    PyList_SET_ITEM(rec, 0, Py_NewRef(seq_obj));
    PyList_SET_ITEM(rec, 1, Py_NewRef(b->info));
    PyList_SET_ITEM(rec, 2, Py_NewRef(b->completed));
    PyList_SET_ITEM(rec, 3, Py_NewRef(zero));
    PyList_SET_ITEM(rec, 4, Py_NewRef(start));
    PyList_SET_ITEM(rec, 5, Py_NewRef(zero));
    PyList_SET_ITEM(rec, 6, Py_NewRef(Py_None));
    Py_XSETREF(*count_slot, next);
    Py_XSETREF(ex->current, Py_NewRef(rec));
    return PyList_SetItem(b->ring, (Py_ssize_t)(i % b->capacity), rec);    /* takes rec */
}

/* A bool field (``_refusing``, ``unsettled``...): 1 unless it holds False (anything else,
   even a field deleted, takes the Python way, which knows what it means). */
static inline int set_at(PyObject *field) {
    return field != Py_False;
}

static PyObject *generic(BoundCall *b, PyObject *const *args, size_t nargsf,
                         PyObject *kwnames) {
    return PyObject_Vectorcall(b->fallback, args, nargsf, kwnames);
}

/* The claimed call failed inside this function (an error of the C API itself): end it as
   any failed call (``fail_inline``) and raise what that says. */
static PyObject *failed(BoundCall *b) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyObject *err = PyObject_CallOneArg(b->abort, value);
    Py_XDECREF(value);
    if (err != NULL) PyErr_SetObject((PyObject *)Py_TYPE(err), err);
    Py_XDECREF(err);
    return NULL;
}

static PyObject *bound_vectorcall(BoundCall *b, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || kwnames != NULL || args[1] != Py_None || args[2] != Py_False
            || Py_TYPE(args[0]) != b->ndarray)
        return generic(b, args, nargsf, kwnames);
    PyArrayObject *arr = (PyArrayObject *)args[0];
    if (!bound_array(arr) || PyArray_DIM(arr, 0) != b->count
            || (PyObject *)PyArray_DESCR(arr) != b->descr)
        return generic(b, args, nargsf, kwnames);

    /* what begin_inline and the closure check before claiming */
    FastPathState *fast = b->fast;
    PyObject *slots = fast->slots;
    if (slots == NULL || slots == Py_None)
        return generic(b, args, nargsf, kwnames);
    Py_INCREF(slots);
    int busy = set_at(((ExecutionState *)b->execution)->refusing);
    if (busy == 0) busy = PyObject_IsTrue(b->queued);
    if (busy != 0) {
        Py_DECREF(slots);
        return busy < 0 ? NULL : generic(b, args, nargsf, kwnames);
    }
    PyObject *got = PyObject_CallOneArg(b->acquire, Py_False);
    if (got == NULL) { Py_DECREF(slots); return NULL; }
    Py_DECREF(got);
    if (got != Py_True) { Py_DECREF(slots); return generic(b, args, nargsf, kwnames); }
    busy = PyObject_IsTrue(b->queued);      /* an asynchronous call goes first */
    if (busy != 0) {
        Py_DECREF(slots);
        PyObject *r = PyObject_CallNoArgs(b->release);
        if (r == NULL) return NULL;
        Py_DECREF(r);
        return busy < 0 ? NULL : generic(b, args, nargsf, kwnames);
    }

    /* claimed: from here every way out ends the call */
    long long seq, k, state;
    PyObject *mapped = NULL;
    if (number(b, &seq) < 0) goto error;
    long long word = ((seq & b->seq_mask) << b->seq_shift) | b->seq_bits;
    /* the segment's array is held while a kernel runs (see FastPath.bind) */
    mapped = PyObject_GetAttr(slots, s_bytes);
    if (mapped == NULL) goto error;
    if (mapped == Py_None) {    /* SharedSlots.close ran (a finalize on another thread) */
        PyErr_SetString(PyExc_RuntimeError, "the fast path's segment is closed "
                        "(communicator finalized)");
        goto error;
    }
    if (b->one_way) {       /* settling_call, pending_call = pending_call, call */
        Py_XSETREF(fast->unsettled, Py_NewRef(Py_True));
        PyObject *settling = fast->settling_call;
        fast->settling_call = fast->pending_call;
        Py_INCREF(b->call);
        fast->pending_call = b->call;
        Py_XDECREF(settling);
    } else if (set_at(fast->unsettled)) {      /* FastPath.settle, its first wait here */
        Py_BEGIN_ALLOW_THREADS
        state = b->settle(0, 0, b->constants, 0, 0);
        Py_END_ALLOW_THREADS
        if (state == 0) {
            Py_XSETREF(fast->unsettled, Py_NewRef(Py_False));
        } else {
            PyObject *st = PyLong_FromLongLong(state);
            PyObject *r = st != NULL ? PyObject_CallOneArg(b->settle_after, st) : NULL;
            Py_XDECREF(st);
            if (r == NULL) goto error;
            Py_DECREF(r);
        }
    }
    k = fast->k != NULL ? PyLong_AsLongLong(fast->k) : -1;
    if (k < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the stage count is unset");
        goto error;
    }
    k += 1;
    PyObject *next_k = PyLong_FromLongLong(k + b->later_stages);
    if (next_k == NULL) goto error;
    Py_XSETREF(fast->k, next_k);
    int64_t data = (int64_t)(intptr_t)PyArray_DATA(arr);
    Py_BEGIN_ALLOW_THREADS
    state = b->kernel(data, b->nbytes, b->constants, k, word);
    Py_END_ALLOW_THREADS
    Py_CLEAR(mapped);
    Py_DECREF(slots);
    slots = NULL;
    int leftovers = set_at(((ExecutionState *)b->execution)->generic_ran);
    if (state != 0 || b->more || leftovers) {
        PyObject *a[4];
        a[0] = args[0];
        a[1] = PyLong_FromLongLong(state);
        a[2] = PyLong_FromLongLong(k);
        a[3] = PyLong_FromLongLong(word);
        if (a[1] == NULL || a[2] == NULL || a[3] == NULL) {
            Py_XDECREF(a[1]); Py_XDECREF(a[2]); Py_XDECREF(a[3]);
            return failed(b);       /* no memory for them: the call still has to end */
        }
        PyObject *r = PyObject_Vectorcall(b->after, a, 4, NULL);
        Py_DECREF(a[1]); Py_DECREF(a[2]); Py_DECREF(a[3]);
        return r;       /* after ended the call, or failed it */
    }
    PyObject *r = PyObject_CallNoArgs(b->release);      /* finish_inline */
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;

error:
    Py_XDECREF(mapped);
    Py_XDECREF(slots);
    return failed(b);
}

static int bound_clear(BoundCall *b);

/* The arguments are parsed into ``p`` (borrowed references) and checked there; ``b`` takes
   its own references only once they all passed, so that a refused call (the closure keeps
   the call, ``FastPath._bind_compiled``) leaves nothing to release that was not taken. */
static int bound_init(BoundCall *b, PyObject *args, PyObject *kwargs) {
    static char *names[] = {
        "fallback", "after", "abort", "fast", "execution", "call", "info", "acquire",
        "release", "queued", "recorder", "ring", "completed", "ndarray", "descr", "count",
        "nbytes", "capacity", "seq_bits", "later_stages", "seq_mask", "seq_shift",
        "one_way", "more", "kernel", "settle", "settle_after", "constants", "keep", NULL};
    BoundCall p;
    memset(&p, 0, sizeof(p));
    PyObject *ndarray;
    long long kernel, settle;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OOOOOOOOOOOOOOOnLnLLLLppLLOLO", names, &p.fallback, &p.after,
            &p.abort, (PyObject **)&p.fast, &p.execution, &p.call, &p.info, &p.acquire,
            &p.release, &p.queued, &p.recorder, &p.ring, &p.completed, &ndarray, &p.descr,
            &p.count, &p.nbytes, &p.capacity, &p.seq_bits, &p.later_stages, &p.seq_mask,
            &p.seq_shift, &p.one_way, &p.more, &kernel, &settle, &p.settle_after,
            &p.constants, &p.keep))
        return -1;
    if (execution_state_type == NULL || zero == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "BoundCall: use_execution_state was not called");
        return -1;
    }
    if (!PyType_Check(ndarray) || kernel == 0 || settle == 0
            || !PyCallable_Check(p.settle_after)
            || !PyObject_TypeCheck(p.execution, execution_state_type)
            || (p.recorder != Py_None
                && !PyObject_TypeCheck(p.recorder, recorder_state_type))
            || !PyObject_TypeCheck((PyObject *)p.fast, &fast_path_state_type)
            || (p.recorder != Py_None && (!PyList_Check(p.ring) || p.capacity < 1))) {
        PyErr_SetString(PyExc_ValueError, "BoundCall: bad arguments");
        return -1;
    }
    p.ndarray = (PyTypeObject *)ndarray;
    p.kernel = (kernel_fn)(intptr_t)kernel;
    p.settle = (kernel_fn)(intptr_t)settle;
    PyObject **refs[] = {&p.fallback, &p.after, &p.settle_after, &p.abort,
                         (PyObject **)&p.fast, &p.execution, &p.call, &p.info, &p.acquire,
                         &p.release, &p.queued, &p.recorder, &p.ring, &p.completed,
                         (PyObject **)&p.ndarray, &p.descr, &p.keep};
    for (size_t i = 0; i < sizeof(refs) / sizeof(refs[0]); i++) Py_INCREF(*refs[i]);
    bound_clear(b);             /* a second __init__ drops what the first one took */
    p.ob_base = b->ob_base;
    *b = p;
    b->vectorcall = (vectorcallfunc)bound_vectorcall;
    return 0;
}

static int bound_traverse(BoundCall *b, visitproc visit, void *arg) {
    Py_VISIT(b->fallback); Py_VISIT(b->after); Py_VISIT(b->settle_after); Py_VISIT(b->abort);
    Py_VISIT((PyObject *)b->fast);
    Py_VISIT(b->execution); Py_VISIT(b->call); Py_VISIT(b->info); Py_VISIT(b->acquire);
    Py_VISIT(b->release); Py_VISIT(b->queued); Py_VISIT(b->recorder); Py_VISIT(b->ring);
    Py_VISIT(b->completed); Py_VISIT((PyObject *)b->ndarray); Py_VISIT(b->descr);
    Py_VISIT(b->keep);
    return 0;
}

static int bound_clear(BoundCall *b) {
    Py_CLEAR(b->fallback); Py_CLEAR(b->after); Py_CLEAR(b->settle_after); Py_CLEAR(b->abort);
    Py_CLEAR(b->fast);
    Py_CLEAR(b->execution); Py_CLEAR(b->call); Py_CLEAR(b->info); Py_CLEAR(b->acquire);
    Py_CLEAR(b->release); Py_CLEAR(b->queued); Py_CLEAR(b->recorder); Py_CLEAR(b->ring);
    Py_CLEAR(b->completed); Py_CLEAR(b->ndarray); Py_CLEAR(b->descr); Py_CLEAR(b->keep);
    return 0;
}

static void bound_dealloc(BoundCall *b) {
    PyObject_GC_UnTrack(b);
    bound_clear(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyMemberDef bound_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(BoundCall, vectorcall), READONLY, NULL},
    {"fallback", T_OBJECT, offsetof(BoundCall, fallback), READONLY,
     "the call the Python way (FastPath.bind's closure)"},
    {NULL}
};

static PyTypeObject BoundCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycoll.fastpath._callpath.BoundCall",
    .tp_doc = "A fast call bound to its kernel: call(arr, timeout, async_op, output).",
    .tp_basicsize = sizeof(BoundCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)bound_init,
    .tp_dealloc = (destructor)bound_dealloc,
    .tp_traverse = (traverseproc)bound_traverse,
    .tp_clear = (inquiry)bound_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(BoundCall, vectorcall),
    .tp_members = bound_members,
};

/* The run of the call the previous allreduce (broadcast) took, remembered by the
   communicator (``FastPath.last_allreduce``: op or root, dtype, bytes, FastCall), if ``arr``
   and ``key`` are of that kind (a new reference), else NULL with no error set. */
static PyObject *last_run(PyObject *last, PyArrayObject *arr, PyObject *key, int by_value) {
    PyObject *descr = (PyObject *)PyArray_DESCR(arr);
    if (last == NULL || !PyTuple_Check(last) || PyTuple_GET_SIZE(last) != 4
            || descr != PyTuple_GET_ITEM(last, 1))
        return NULL;
    PyObject *was = PyTuple_GET_ITEM(last, 0);
    int same = was == key;
    if (!same && by_value && PyLong_CheckExact(key) && PyLong_CheckExact(was))
        same = PyObject_RichCompareBool(was, key, Py_EQ) == 1;
    if (!same && !by_value && PyUnicode_CheckExact(key) && PyUnicode_CheckExact(was))
        same = PyUnicode_Compare(was, key) == 0;
    if (!same) return NULL;
    Py_INCREF(last);        /* the lookup below could run code that replaces it */
    PyObject *run = PyObject_GetAttr(PyTuple_GET_ITEM(last, 3), s_run);
    if (run == NULL) { PyErr_Clear(); Py_DECREF(last); return NULL; }
    /* the array's length: a BoundCall's count, or (a call bound only in Python) its bytes */
    int fits;
    if (Py_TYPE(run) == &BoundCallType) {
        fits = PyArray_DIM(arr, 0) == ((BoundCall *)run)->count;
    } else {
        PyObject *size = PyObject_GetAttr(descr, s_itemsize);
        long long itemsize = size != NULL ? PyLong_AsLongLong(size) : -1;
        long long nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(last, 2));
        Py_XDECREF(size);
        PyErr_Clear();
        fits = itemsize >= 0 && nbytes == itemsize * (long long)PyArray_DIM(arr, 0);
    }
    Py_DECREF(last);
    if (!fits) { Py_DECREF(run); return NULL; }
    return run;
}

/* ``run(arr, timeout, async_op, output)`` (``args``; a BoundCall without its Python
   wrapping), and ``run`` released. */
static PyObject *run_call(PyObject *run, PyObject *const *args) {
    PyObject *r = Py_TYPE(run) == &BoundCallType && ((BoundCall *)run)->fallback != NULL
        ? bound_vectorcall((BoundCall *)run, args, 4, NULL)
        : PyObject_Vectorcall(run, args, 4, NULL);
    Py_DECREF(run);
    return r;
}

/* The previous call's kind, if ``tensor`` is a 1-D C-contiguous aligned writable numpy
   array of it, run (``FastCall.run``: compiled or not) with ``timeout`` and ``async_op``;
   NotImplemented (a new reference) when it is not that kind (the caller classifies it). */
static PyObject *run_last(FastPathState *fast, int broadcast, PyObject *tensor, PyObject *key,
                          PyObject *timeout, PyObject *async_op) {
    if (ndarray_type == NULL || Py_TYPE(tensor) != ndarray_type) Py_RETURN_NOTIMPLEMENTED;
    PyArrayObject *arr = (PyArrayObject *)tensor;
    if (!bound_array(arr)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *run = last_run(broadcast ? fast->last_broadcast : fast->last_allreduce, arr,
                             key, broadcast);
    if (run == NULL) Py_RETURN_NOTIMPLEMENTED;
    PyObject *call_args[4] = {tensor, timeout, async_op, tensor};
    return run_call(run, call_args);
}

/* ``Communicator.allreduce``, ``broadcast`` and ``barrier`` as C methods
   (``collectives.py`` installs them where this module is built). A small call's Python
   method (its frame, its eight parameters, its checks) is a large part of the call; this
   one reads the arguments of the calls the fast path takes (``tensor`` and the op or root,
   ``timeout`` and ``async_op``, the other options at None) and the communicator's ``_fast``
   (and ``_integrity_every``), and runs the bound call: ``run_last``, or the barrier's. Every
   other call, and every call those do not take, goes to the Python method ``func`` as it
   was made, which stays the one description of the call. A method descriptor
   (``Py_TPFLAGS_METHOD_DESCRIPTOR``): ``comm.allreduce(t)`` calls it with the communicator
   first and makes no bound method. */
enum { ALLREDUCE, BROADCAST, BARRIER };
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *func;             /* the Python method */
    int kind;                   /* allreduce(tensor, op), broadcast(tensor, root), barrier() */
} FastMethod;

static PyObject *s_fast, *s_integrity_every, *s_op, *s_root, *s_algo, *s_timeout,
    *s_async_op, *s_deterministic, *s_accumulate, *s_integrity, *s_sum, *zero_int;

static PyObject *method_vectorcall(FastMethod *m, PyObject *const *args, size_t nargsf,
                                   PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int broadcast = m->kind == BROADCAST;
    if (m->kind == BARRIER ? nargs != 1 : nargs < 2 || nargs > 3) goto python;
    PyObject *key = nargs == 3 ? args[2] : NULL;
    PyObject *timeout = Py_None, *async_op = Py_False;
    if (kwnames != NULL) {      /* names from a call site are interned: compared by identity */
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
            if (name == s_timeout) timeout = value;
            else if (name == s_async_op) async_op = value;
            else if (value == Py_None && name == s_algo) continue;
            else if (m->kind == BARRIER) goto python;
            else if (key == NULL && name == (broadcast ? s_root : s_op)) key = value;
            else if (value == Py_None && (name == s_integrity
                                          || (!broadcast && (name == s_deterministic
                                                             || name == s_accumulate))))
                continue;
            else goto python;
        }
    }
    if (key == NULL) key = broadcast ? zero_int : s_sum;
    PyObject *comm = args[0];
    /* an attribute that is not there: the Python method says what is wrong; any other
       error (a KeyboardInterrupt in a property, no memory) is this call's */
    PyObject *fast = PyObject_GetAttr(comm, s_fast);
    if (fast == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
        PyErr_Clear();
        goto python;
    }
    if (!PyObject_TypeCheck(fast, &fast_path_state_type)) { Py_DECREF(fast); goto python; }
    if (m->kind == BARRIER) {   /* the barrier's bound call, once the first one made it */
        FastPathState *f = (FastPathState *)fast;
        PyObject *call = f->barrier_call, *buffer = f->barrier_buffer;
        if (call == NULL || call == Py_None || buffer == NULL) {
            Py_DECREF(fast);
            goto python;
        }
        Py_INCREF(call);        /* held first: the lookup below (and the call) may run code */
        Py_INCREF(buffer);      /* that replaces the fields */
        PyObject *run = PyObject_GetAttr(call, s_run);
        Py_DECREF(call);
        if (run == NULL) {
            Py_DECREF(buffer);
            Py_DECREF(fast);
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
            PyErr_Clear();
            goto python;
        }
        PyObject *call_args[4] = {buffer, timeout, async_op, Py_None};
        PyObject *r = run_call(run, call_args);
        Py_DECREF(buffer);
        Py_DECREF(fast);
        return r;
    }
    PyObject *every = PyObject_GetAttr(comm, s_integrity_every);    /* sampled checks: */
    int sampling = 1;                                                /* the Python way */
    if (every != NULL) {
        sampling = PyObject_IsTrue(every);
        Py_DECREF(every);
    } else if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    }
    if (sampling != 0) {
        Py_DECREF(fast);
        if (PyErr_Occurred()) return NULL;
        goto python;
    }
    PyObject *r = run_last((FastPathState *)fast, broadcast, args[1], key, timeout,
                           async_op);
    Py_DECREF(fast);
    if (r != Py_NotImplemented) return r;
    Py_DECREF(r);
python:
    return PyObject_Vectorcall(m->func, args, nargsf, kwnames);
}

static PyObject *method_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *func;
    const char *kind;
    if (kwargs != NULL || !PyArg_ParseTuple(args, "Os:FastMethod", &func, &kind))
        return NULL;
    int k = strcmp(kind, "allreduce") == 0 ? ALLREDUCE : strcmp(kind, "broadcast") == 0
        ? BROADCAST : strcmp(kind, "barrier") == 0 ? BARRIER : -1;
    if (!PyCallable_Check(func) || k < 0) {
        PyErr_SetString(PyExc_TypeError, "FastMethod(func, kind): a callable, and "
                        "'allreduce', 'broadcast' or 'barrier'");
        return NULL;
    }
    FastMethod *m = (FastMethod *)type->tp_alloc(type, 0);
    if (m == NULL) return NULL;
    m->func = Py_NewRef(func);
    m->kind = k;
    m->vectorcall = (vectorcallfunc)method_vectorcall;
    return (PyObject *)m;
}

static int method_traverse(FastMethod *m, visitproc visit, void *arg) {
    Py_VISIT(m->func);
    return 0;
}

static int method_clear(FastMethod *m) {
    Py_CLEAR(m->func);
    return 0;
}

static void method_dealloc(FastMethod *m) {
    PyObject_GC_UnTrack(m);
    method_clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

/* ``comm.allreduce`` not called at once: a bound method, as for a Python function. */
static PyObject *method_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* What is not this object's own (``__name__``, ``__doc__``, ``__module__``...) is the
   Python method's: ``help`` and ``inspect.signature`` (through ``__wrapped__``) see it. */
static PyObject *method_getattro(PyObject *self, PyObject *name) {
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0)
        return Py_NewRef(((FastMethod *)self)->func);
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__class__") != 0
            && PyUnicode_CompareWithASCIIString(name, "__get__") != 0) {
        PyObject *v = PyObject_GetAttr(((FastMethod *)self)->func, name);
        if (v != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return v;
        PyErr_Clear();
    }
    return PyObject_GenericGetAttr(self, name);
}

static PyTypeObject FastMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycoll.fastpath._callpath.FastMethod",
    .tp_doc = "FastMethod(func, kind): Communicator.allreduce, broadcast or barrier, "
              "compiled.",
    .tp_basicsize = sizeof(FastMethod),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
        | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = method_new,
    .tp_dealloc = (destructor)method_dealloc,
    .tp_traverse = (traverseproc)method_traverse,
    .tp_clear = (inquiry)method_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastMethod, vectorcall),
    .tp_descr_get = method_get,
    .tp_getattro = method_getattro,
};

/* ``type`` is the type ``struct`` describes: at least as large (a stale build of the other
   module, or a numpy with another array struct, is refused, and the calls stay in Python). */
static int is_type_of(PyObject *type, Py_ssize_t size, const char *name) {
    if (!PyType_Check(type) || ((PyTypeObject *)type)->tp_basicsize < size) {
        PyErr_Format(PyExc_TypeError, "%s is not the type this module was built against "
                     "(%R)", name, type);
        return 0;
    }
    return 1;
}

/* use_execution_state(ExecutionState, RecorderState): the types of
   ``pycoll/runtime/_execution_state.h``'s structs, set once, at import. */
static PyObject *use_execution_state(PyObject *module, PyObject *const *args,
                                     Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "use_execution_state(ExecutionState, RecorderState)");
        return NULL;
    }
    if (!is_type_of(args[0], sizeof(ExecutionState), "ExecutionState")
            || !is_type_of(args[1], sizeof(RecorderState), "RecorderState"))
        return NULL;
    Py_XSETREF(execution_state_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(recorder_state_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* use_ndarray(numpy.ndarray): the array type this module takes (set once, at import). */
static PyObject *use_ndarray(PyObject *module, PyObject *type) {
    if (!is_type_of(type, sizeof(PyArrayObject_fields), "numpy.ndarray")) return NULL;
    Py_XSETREF(ndarray_type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"use_ndarray", use_ndarray, METH_O, "the array type the bound calls take"},
    {"use_execution_state", (PyCFunction)(void (*)(void))use_execution_state, METH_FASTCALL,
     "use_execution_state(ExecutionState, RecorderState): the types of the fields read"},
    {NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_callpath",
    .m_doc = "The fast path's bound call, compiled.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__callpath(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_bytes, "bytes"); INTERN(s_run, "run"); INTERN(s_itemsize, "itemsize");
    INTERN(s_fast, "_fast"); INTERN(s_integrity_every, "_integrity_every");
    INTERN(s_op, "op"); INTERN(s_root, "root"); INTERN(s_algo, "algo");
    INTERN(s_timeout, "timeout"); INTERN(s_async_op, "async_op");
    INTERN(s_deterministic, "deterministic"); INTERN(s_accumulate, "accumulate");
    INTERN(s_integrity, "integrity"); INTERN(s_sum, "sum");
#undef INTERN
    if (zero_int == NULL && (zero_int = PyLong_FromLong(0)) == NULL) return NULL;
    if (PyType_Ready(&BoundCallType) < 0 || PyType_Ready(&fast_path_state_type) < 0
            || PyType_Ready(&FastMethodType) < 0)
        return NULL;
    if (zero == NULL && (zero = PyFloat_FromDouble(0.0)) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BoundCall", (PyObject *)&BoundCallType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "FastPathState", (PyObject *)&fast_path_state_type) < 0
            || PyModule_AddObjectRef(m, "FastMethod", (PyObject *)&FastMethodType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
