/* What an Execution changes on every call, in a C struct: ``Execution`` derives from
   ``ExecutionState`` when this module is built, so that its Python code reads and writes
   these as ordinary attributes while the fast path's compiled call
   (``pycoll/fastpath/_callpath.c``) reads them without a lookup, at the offsets this module
   publishes (``offsets``: a capsule). Optional, like that call: without it ``Execution``
   derives from ``object`` and keeps the same attributes in its dict. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>

#include "../object_fields.h"

/* Python objects, not C numbers: CPython specializes reading an object slot (a member of
   type T_OBJECT_EX) as it does an instance attribute, so the Python paths that read these
   (every generic call) pay nothing for them being here. */
typedef struct {
    PyObject_HEAD
    PyObject *seq;              /* int: collectives started so far */
    PyObject *started;          /* float: when the call running inline started (monotonic) */
    PyObject *current;          /* its flight record, or None */
    PyObject *refusing;         /* bool: failed or closed, what begin_inline checks */
    PyObject *generic_ran;      /* bool: a call sent messages since the fast path looked */
} ExecutionState;

/* Where each field is, for _callpath.c (the order is its contract: see there). */
static const Py_ssize_t OFFSETS[] = {
    offsetof(ExecutionState, seq), offsetof(ExecutionState, started),
    offsetof(ExecutionState, current), offsetof(ExecutionState, refusing),
    offsetof(ExecutionState, generic_ran), sizeof(ExecutionState),
};

static PyMemberDef state_members[] = {
    {"seq", T_OBJECT_EX, offsetof(ExecutionState, seq), 0, NULL},
    {"started", T_OBJECT_EX, offsetof(ExecutionState, started), 0, NULL},
    {"current", T_OBJECT_EX, offsetof(ExecutionState, current), 0, NULL},
    {"_refusing", T_OBJECT_EX, offsetof(ExecutionState, refusing), 0, NULL},
    {"generic_ran", T_OBJECT_EX, offsetof(ExecutionState, generic_ran), 0, NULL},
    {NULL}
};

static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    ExecutionState *s = (ExecutionState *)object_fields_new(type, state_members);
    if (s == NULL) return NULL;
    PyObject *seq = PyLong_FromLong(0), *started = PyFloat_FromDouble(0.0);
    if (seq == NULL || started == NULL) {
        Py_XDECREF(seq);
        Py_XDECREF(started);
        Py_DECREF(s);
        return NULL;
    }
    Py_XSETREF(s->seq, seq);
    Py_XSETREF(s->started, started);
    Py_XSETREF(s->refusing, Py_NewRef(Py_False));
    Py_XSETREF(s->generic_ran, Py_NewRef(Py_False));
    return (PyObject *)s;
}

OBJECT_FIELDS_TYPE(execution_state, ExecutionState, state_members, state_new,
                   "pycoll.runtime._execution_state.ExecutionState",
                   "What an Execution changes on every call (Execution derives from it).");

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_execution_state",
    .m_doc = "What an Execution changes on every call, in a C struct.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__execution_state(void) {
    if (PyType_Ready(&execution_state_type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *offsets = PyCapsule_New((void *)OFFSETS,
                                      "pycoll.runtime._execution_state.offsets", NULL);
    if (offsets == NULL
            || PyModule_AddObjectRef(m, "ExecutionState",
                                     (PyObject *)&execution_state_type) < 0
            || PyModule_AddObjectRef(m, "offsets", offsets) < 0) {
        Py_XDECREF(offsets);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(offsets);
    return m;
}
