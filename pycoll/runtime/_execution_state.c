/* What an Execution and its flight recorder change on every call, in C structs
   (``_execution_state.h``): ``Execution`` derives from ``ExecutionState`` and
   ``FlightRecorder`` from ``RecorderState`` when this module is built, so that their Python
   code reads and writes these as ordinary attributes while the fast path's compiled call
   (``pycoll/fastpath/_callpath.c``, which includes the same header) reads them without a
   lookup. Optional, like that call: without it both derive from ``object`` and keep the
   same attributes in their dict (or slots). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>

#include "../object_fields.h"
#include "_execution_state.h"

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

static PyMemberDef recorder_members[] = {
    {"capacity", T_OBJECT_EX, offsetof(RecorderState, capacity), 0, NULL},
    {"ring", T_OBJECT_EX, offsetof(RecorderState, ring), 0, NULL},
    {"count", T_OBJECT_EX, offsetof(RecorderState, count), 0, NULL},
    {NULL}
};

static PyObject *recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    return object_fields_new(type, recorder_members);   /* FlightRecorder.__init__ sets them */
}

OBJECT_FIELDS_TYPE(recorder_state, RecorderState, recorder_members, recorder_new,
                   "pycoll.runtime._execution_state.RecorderState",
                   "A flight recorder's ring (FlightRecorder derives from it).");

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_execution_state",
    .m_doc = "What an Execution and its flight recorder change on every call, in C structs.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__execution_state(void) {
    if (PyType_Ready(&execution_state_type) < 0 || PyType_Ready(&recorder_state_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "ExecutionState", (PyObject *)&execution_state_type) < 0
            || PyModule_AddObjectRef(m, "RecorderState", (PyObject *)&recorder_state_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
