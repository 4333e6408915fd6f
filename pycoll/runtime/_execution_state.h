/* The structs of ``_execution_state``'s types (``_execution_state.c`` makes the types), for
   the C code that reads their fields directly: the fast path's compiled call
   (``pycoll/fastpath/_callpath.c``). This header is the one description of their layout;
   the reader checks, once, that the types it is given are as large as these structs (a
   stale build of one module). */
#ifndef PYCOLL_EXECUTION_STATE_H
#define PYCOLL_EXECUTION_STATE_H

#include <Python.h>

/* What an Execution changes on every call. Python objects, not C numbers: CPython
   specializes reading an object slot (a member of type T_OBJECT_EX) as it does an instance
   attribute, so the Python paths that read these (every generic call) pay nothing for them
   being here. */
typedef struct {
    PyObject_HEAD
    PyObject *seq;              /* int: collectives started so far */
    PyObject *started;          /* float: when the call running inline started (monotonic) */
    PyObject *current;          /* its flight record, or None */
    PyObject *refusing;         /* bool: failed or closed, what begin_inline checks */
    PyObject *generic_ran;      /* bool: a call sent messages since the fast path looked */
} ExecutionState;

/* A flight recorder's ring (``FlightRecorder`` derives from it). */
typedef struct {
    PyObject_HEAD
    PyObject *capacity;         /* int: records kept */
    PyObject *ring;             /* list of capacity records (or None) */
    PyObject *count;            /* int: records ever opened */
} RecorderState;

#endif
