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

static int state_traverse(ExecutionState *s, visitproc visit, void *arg) {
    Py_VISIT(s->seq); Py_VISIT(s->started); Py_VISIT(s->current); Py_VISIT(s->refusing);
    Py_VISIT(s->generic_ran);
    return 0;
}

static int state_clear(ExecutionState *s) {
    Py_CLEAR(s->seq); Py_CLEAR(s->started); Py_CLEAR(s->current); Py_CLEAR(s->refusing);
    Py_CLEAR(s->generic_ran);
    return 0;
}

static void state_dealloc(ExecutionState *s) {
    PyObject_GC_UnTrack(s);
    state_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *state_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    ExecutionState *s = (ExecutionState *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->seq = PyLong_FromLong(0);
    s->started = PyFloat_FromDouble(0.0);
    if (s->seq == NULL || s->started == NULL) {
        Py_DECREF(s);
        return NULL;
    }
    s->current = Py_NewRef(Py_None);
    s->refusing = Py_NewRef(Py_False);
    s->generic_ran = Py_NewRef(Py_False);
    return (PyObject *)s;
}

static PyMemberDef state_members[] = {
    {"seq", T_OBJECT_EX, offsetof(ExecutionState, seq), 0, NULL},
    {"started", T_OBJECT_EX, offsetof(ExecutionState, started), 0, NULL},
    {"current", T_OBJECT_EX, offsetof(ExecutionState, current), 0, NULL},
    {"_refusing", T_OBJECT_EX, offsetof(ExecutionState, refusing), 0, NULL},
    {"generic_ran", T_OBJECT_EX, offsetof(ExecutionState, generic_ran), 0, NULL},
    {NULL}
};

static PyTypeObject ExecutionStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pycoll.runtime._execution_state.ExecutionState",
    .tp_doc = "What an Execution changes on every call (Execution derives from it).",
    .tp_basicsize = sizeof(ExecutionState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = state_new,
    .tp_dealloc = (destructor)state_dealloc,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_members = state_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_execution_state",
    .m_doc = "What an Execution changes on every call, in a C struct.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__execution_state(void) {
    if (PyType_Ready(&ExecutionStateType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *offsets = PyCapsule_New((void *)OFFSETS,
                                      "pycoll.runtime._execution_state.offsets", NULL);
    Py_INCREF(&ExecutionStateType);
    if (offsets == NULL
            || PyModule_AddObject(m, "ExecutionState", (PyObject *)&ExecutionStateType) < 0
            || PyModule_AddObject(m, "offsets", offsets) < 0) {
        Py_XDECREF(offsets);
        Py_DECREF(&ExecutionStateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
