/* A C struct of Python objects that a Python class derives from: ``ExecutionState`` and
   ``RecorderState`` (runtime/_execution_state.h) and ``FastPathState``
   (fastpath/_callpath.c). The compiled call path reads their per-call fields as struct
   fields, without a lookup; they stay ordinary attributes (``T_OBJECT_EX`` members) for the
   Python code.

   Such a struct is ``PyObject_HEAD`` followed by ``PyObject *`` fields, each named in the
   type's member table, which is the one description of the fields: the garbage
   collector's traverse and clear, the dealloc and the type object are made from it here
   (``OBJECT_FIELDS_TYPE``). ``object_fields_new`` sets every field to None; the type's own
   ``tp_new`` then replaces the fields that start otherwise. */
#ifndef PYCOLL_OBJECT_FIELDS_H
#define PYCOLL_OBJECT_FIELDS_H

#include <Python.h>
#include <structmember.h>

#define OBJECT_FIELD(obj, member) (*(PyObject **)((char *)(obj) + (member)->offset))

static inline int object_fields_traverse(PyObject *obj, PyMemberDef *m, visitproc visit,
                                         void *arg) {
    for (; m->name != NULL; m++)
        if (m->type == T_OBJECT_EX) Py_VISIT(OBJECT_FIELD(obj, m));
    return 0;
}

static inline int object_fields_clear(PyObject *obj, PyMemberDef *m) {
    for (; m->name != NULL; m++)
        if (m->type == T_OBJECT_EX) Py_CLEAR(OBJECT_FIELD(obj, m));
    return 0;
}

/* A new instance with every field None (a new reference), or NULL. */
static inline PyObject *object_fields_new(PyTypeObject *type, PyMemberDef *m) {
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) return NULL;
    for (; m->name != NULL; m++)
        if (m->type == T_OBJECT_EX) OBJECT_FIELD(obj, m) = Py_NewRef(Py_None);
    return obj;
}

/* ``PREFIX_traverse``, ``PREFIX_clear``, ``PREFIX_dealloc`` and the type object
   ``PREFIX_type`` (a base type for Python classes, garbage-collected) of ``Struct`` with
   the member table ``MEMBERS`` and the constructor ``NEW``. */
#define OBJECT_FIELDS_TYPE(PREFIX, Struct, MEMBERS, NEW, NAME, DOC)                        \
    static int PREFIX##_traverse(PyObject *obj, visitproc visit, void *arg) {              \
        return object_fields_traverse(obj, MEMBERS, visit, arg);                           \
    }                                                                                       \
    static int PREFIX##_clear(PyObject *obj) { return object_fields_clear(obj, MEMBERS); } \
    static void PREFIX##_dealloc(PyObject *obj) {                                          \
        PyObject_GC_UnTrack(obj);                                                          \
        PREFIX##_clear(obj);                                                               \
        Py_TYPE(obj)->tp_free(obj);                                                        \
    }                                                                                       \
    static PyTypeObject PREFIX##_type = {                                                  \
        PyVarObject_HEAD_INIT(NULL, 0)                                                     \
        .tp_name = NAME,                                                                   \
        .tp_doc = DOC,                                                                     \
        .tp_basicsize = sizeof(Struct),                                                    \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,         \
        .tp_new = NEW,                                                                     \
        .tp_dealloc = PREFIX##_dealloc,                                                    \
        .tp_traverse = PREFIX##_traverse,                                                  \
        .tp_clear = PREFIX##_clear,                                                        \
        .tp_members = MEMBERS,                                                             \
    }

#endif
