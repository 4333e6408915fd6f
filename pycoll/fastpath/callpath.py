"""The small fast call's Python: ``comm.allreduce`` / ``broadcast`` / ``barrier`` up to the
kernel, and the call around the kernel (``BoundCall``).

A small fast call (one slot, or a one-way broadcast) costs its kernel (flags and copies
between cores) plus the Python around it, which can cost more: the method's arguments, the
lookup of the call's kind, claiming the execution, numbering, the flight record, the stage
counter, the call into numba. This module is all of that, once. setup.py compiles it with
Cython (``callpath.pxd`` types it: the fields of ``FastPathState`` and of
``runtime.state``'s classes are read as C struct fields, the arrays through numpy's own
header, and the kernel is called through the C function pointer of a numba ``cfunc``,
``kernels.bound_cfunc``, with the GIL released); where it is not built, or
``PYCOLL_FASTPATH_C=0``, it runs as the plain Python it is (``runtime.compiled``), calling
the kernel through numba's entry point for exactly its argument types
(``FastPath.entry_point``). The ``cython.compiled`` branches are the only differences: how an
array is read and how the kernel is called.

What the kernel leaves to Python (a sleep, a reduction numpy does, avg's scale, the
leftovers of a generic call) goes to ``BoundCall.after``, and every call that is not the
common case (asynchronous, with its own timeout, queued behind one, on a refused
communicator) to the generic execution (``FastPath.run_generic``).
Measurements: docs/performance.md; design: docs/algorithms.md#the-compiled-call-path.
"""
from __future__ import annotations

from typing import Any

import numpy as np

try:
    import cython
except ImportError:         # interpreted, and Cython is not installed
    from ..runtime import nocython as cython

from ..buffers.reduction import OpLike
from ..buffers.tensors import torch_host_view

#: whether this module runs compiled
COMPILED: bool = cython.compiled

_ndarray = np.ndarray
_uint8 = np.uint8

if not cython.compiled:     # what callpath.pxd declares from numpy's header (compiled only)
    PyArrayObject = NPY_ARRAY_CARRAY = None

    def _compiled_only(*args: Any) -> Any:
        raise AssertionError("compiled only")

    PyArray_NDIM = PyArray_DIM = PyArray_DESCR = PyArray_DATA = PyArray_CHKFLAGS = \
        kernel_fn = _compiled_only


class FastPathState:
    """What a ``FastPath`` changes on every call (``FastPath`` derives from this), where the
    compiled call reads it as struct fields."""

    def __init__(self) -> None:
        self.slots: Any = None          # SharedSlots, or None once closed
        self.k = 0                      # stages run so far (all ranks count alike)
        #: whether ``pending`` may hold a stage (a one-way broadcast not yet settled)
        self.unsettled = False
        #: the last one-way broadcast's call, and the one it settles first
        self.pending_call: Any = None
        self.settling_call: Any = None
        #: the entry of ``host_calls`` that the previous allreduce (broadcast) took, as (op
        #: or root, dtype, length, FastCall): compared by identity before any hashing
        self.last_allreduce: tuple = NO_CALL
        self.last_broadcast: tuple = NO_CALL
        #: the calls a 1-D numpy array takes without ``as_buffer``: (collective, op or root
        #: as passed, dtype, length) -> FastCall (``FastPath.remember``)
        self.host_calls: dict = {}
        self.barrier_call: Any = None       # made by the first barrier
        self.barrier_buffer = np.zeros(0, dtype=np.uint8)
        self.execution: Any = None


#: a ``last_allreduce`` (``last_broadcast``) that matches no call
NO_CALL: tuple = (object(), None, -1, None)


class BoundCall:
    """``FastCall.run`` of a call that can run inline: ``run(arr, timeout, async_op,
    output)`` on a 1-D C-contiguous aligned writable array of the call's dtype and length.

    What never changes for the call or the communicator is read once, here. The common case
    (synchronous, no timeout of its own, nothing queued) claims the execution
    (``ExecutionState.begin_inline``: numbered, recorded) and runs the kernel in the
    caller's thread: the bound single-slot kernel (``kernels.allreduce_bound``,
    ``broadcast_bound``) with the call's constants passed by address, or ``launch`` for the
    other kinds. A call right after a one-way broadcast settles it first."""

    def __init__(self, fast: Any, call: Any, bound: bool, raw: bool, entry_raw: bool,
                 entry: tuple[str, Any], constants: int) -> None:
        execution = fast.execution
        self.fast = fast
        self.execution = execution
        self.call = call
        self.info = call.info
        self.seq_bits = call.seq_bits
        self.later_stages = call.stages - 1
        self.one_way = call.one_way
        #: what the kernel leaves to Python: a reduction here, a finish (avg's scale)
        self.more = bool(call.reduce_here or call.finish)
        #: ``bound``: the single-slot kernel's entry; else ``launch``. ``raw``: the kernel
        #: takes the array's bytes (``entry_raw``: the bound entry does)
        self.bound = bound
        self.raw = raw
        self.entry_raw = entry_raw
        self.entry_name, self.entry_dtype = entry
        self.entry: Any = None      # numba's entry point, made by the first call needing it
        self.constants = constants
        self.count = call.count
        self.nbytes = call.nbytes
        self.descr: Any = None
        self.keep: tuple = ()
        self.direct = False
        if cython.compiled and bound:
            self._use_cfuncs()

    def _use_cfuncs(self) -> None:
        """The compiled form calls the kernel through a numba ``cfunc``'s C function
        pointer, for arrays of exactly the call's dtype (``descr``; not one that numpy does
        not name, bfloat16: those go through the entry point)."""
        try:
            descr = np.dtype(self.call.dtype)
        except TypeError:
            return
        from .kernels import bound_cfunc
        kernel = bound_cfunc("broadcast_bound" if self.one_way else "allreduce_bound",
                             "uint8" if self.one_way or self.raw else self.call.dtype)
        settle = bound_cfunc("settle_bound", "uint8")
        self.descr = descr
        self.keep = (kernel, settle)
        self.kernel = cython.cast(kernel_fn, cython.cast(cython.size_t, kernel.address))
        self.settle_kernel = cython.cast(kernel_fn, cython.cast(cython.size_t, settle.address))
        self.direct = True

    def __call__(self, arr: np.ndarray, timeout: Any, async_op: bool, output: Any) -> Any:
        return self.run(arr, timeout, async_op, output)

    def run(self, arr: np.ndarray, timeout: Any, async_op: bool, output: Any) -> Any:
        """The call on ``arr`` (see the class)."""
        fast = self.fast
        slots = fast.slots
        if (async_op or timeout is not None or slots is None
                or (self.direct and not self._exact(arr))):
            return fast.run_generic(self.call, arr, timeout, async_op, output)
        execution = self.execution
        word = execution.begin_inline(self.info, self.seq_bits)
        if not word:
            return fast.run_generic(self.call, arr, timeout, async_op, output)
        try:
            if self.one_way:
                fast.unsettled = True
                fast.settling_call, fast.pending_call = fast.pending_call, self.call
            elif fast.unsettled:
                self._settle()
            k = fast.k + 1
            fast.k = k + self.later_stages
            if self.bound:
                # the kernel gets only the segment's address (its constants): its array is
                # held while the kernel runs, so that a finalize on another thread cannot
                # unmap it (SharedSlots.close leaves a mapping that is still exported), and
                # dropped after, so that a failure's traceback does not keep it
                mapped = slots.bytes
                if mapped is None:      # closed by a finalize while this call settled
                    fast.open_slots(self.call, word)
                state = self._kernel(arr, k, word)
                mapped = None
            else:
                state = fast.launch(self.call, arr.view(_uint8) if self.raw else arr, k, word,
                                    False, 0)
        except BaseException as e:  # noqa: BLE001 - reported like any failed call
            err = execution.fail_inline(self.info, e)
            if err is e:
                raise
            raise err from None
        if state != 0 or self.more or execution.generic_ran:
            self.after(arr, state, k, word)
        else:
            execution.finish_inline()
        return None

    def _exact(self, arr: Any) -> bool:
        """Whether ``arr`` is exactly what the cfunc was bound to: it reads ``nbytes`` from
        the array's data address."""
        if cython.compiled:
            if type(arr) is not _ndarray:
                return False
            a = cython.cast(cython.pointer(PyArrayObject), arr)
            return (PyArray_NDIM(a) == 1 and PyArray_CHKFLAGS(a, NPY_ARRAY_CARRAY)
                    and PyArray_DIM(a, 0) == self.count
                    and PyArray_DESCR(a) == cython.cast(cython.p_void, self.descr))
        return True

    def _kernel(self, arr: np.ndarray, k: int, word: int) -> int:
        """The bound kernel from stage ``k``; its status."""
        if cython.compiled and self.direct:
            data = cython.cast(cython.longlong, cython.cast(cython.size_t, PyArray_DATA(
                cython.cast(cython.pointer(PyArrayObject), arr))))
            with cython.nogil:
                state = self.kernel(data, self.nbytes, self.constants, k, word)
            return state
        if self.entry is None:
            self.entry = self.fast.entry_point(self.entry_dtype, self.entry_name)
        return self.entry(arr.view(_uint8) if self.entry_raw else arr, self.constants, k,
                          word)

    def _settle(self) -> None:
        """``FastPath.settle`` (the last one-way broadcast published everywhere), its first
        wait through the cfunc of ``kernels.settle_bound`` where compiled."""
        fast = self.fast
        if cython.compiled and self.direct:
            constants = self.constants
            with cython.nogil:
                state = self.settle_kernel(0, 0, constants, 0, 0)
            if state == 0:
                fast.unsettled = False
            else:
                fast.settle_after(state)
            return
        execution = self.execution
        fast.settle(execution.started + execution.timeout)

    def after(self, arr: np.ndarray, state: int, k: int, word: int) -> None:
        """The rest of a claimed call once its kernel returned ``state``: what the kernel
        left to Python (a sleep, a reduction numpy does, avg's scale, the leftovers of a
        generic call), then the call's end."""
        fast, execution, call = self.fast, self.execution, self.call
        try:
            if state != 0 or self.more:
                fast.complete(state, call, arr, arr.view(_uint8) if self.raw else arr,
                               execution.seq, word, k, execution.started + execution.timeout)
            if execution.generic_ran:
                execution.generic_ran = False
                fast.liveness.refuse_leftovers(word)
        except BaseException as e:  # noqa: BLE001 - reported like any failed call
            err = execution.fail_inline(self.info, e)
            if err is e:
                raise
            raise err from None
        execution.finish_inline()


def bind(fast: Any, call: Any, bound: bool, raw: bool, entry_raw: bool,
         entry: tuple[str, Any], constants: int) -> Any:
    """``call.run`` (see ``BoundCall``): the object itself where compiled (the fronts below
    call it without Python in between), its bound method ``run`` where not (one call less)."""
    run = BoundCall(fast, call, bound, raw, entry_raw, entry, constants)
    return run if cython.compiled else run.run


def _run(run: Any, arr: Any, timeout: Any, async_op: bool, output: Any) -> Any:
    """``run(arr, timeout, async_op, output)``, a BoundCall called directly where compiled."""
    if cython.compiled and type(run) is BoundCall:
        return cython.cast(BoundCall, run).run(arr, timeout, async_op, output)
    return run(arr, timeout, async_op, output)


def _known(fast: Any, allreduce: bool, key: Any, arr: Any) -> Any:
    """The FastCall of the allreduce (else the broadcast) with ``key`` (op or root, as
    passed) for ``arr``, if ``arr`` is a 1-D C-contiguous aligned writable array of a kind
    already validated (no classification needed), else None. The kind of the previous call
    is compared first, by identity and without a tuple to hash (an op string read from a
    command line is equal to the one remembered, not the same object)."""
    if cython.compiled:
        a = cython.cast(cython.pointer(PyArrayObject), arr)
        if not (PyArray_NDIM(a) == 1 and PyArray_CHKFLAGS(a, NPY_ARRAY_CARRAY)):
            return None
        dtype = cython.cast(object, PyArray_DESCR(a))
        length = PyArray_DIM(a, 0)
    else:
        if not (arr.ndim == 1 and arr.flags.carray):
            return None
        dtype, length = arr.dtype, len(arr)
    last = fast.last_allreduce if allreduce else fast.last_broadcast
    was = last[0]
    if (last[1] is dtype and last[2] == length
            and (was is key or ((type(key) is str or type(key) is int) and was == key))):
        return last[3]
    try:
        call = fast.host_calls.get(("allreduce" if allreduce else "broadcast", key, dtype,
                                    length))
    except TypeError:
        return None          # an unhashable op: parse_op says what is wrong
    if call is not None:
        if allreduce:
            fast.last_allreduce = (key, dtype, length, call)
        else:
            fast.last_broadcast = (key, dtype, length, call)
    return call


# -- the methods: Communicator.allreduce, broadcast, barrier (comm/collectives.py) --------
# A call of a kind the fast path has bound runs from here; every other one goes to the
# Python method that classifies it (``_allreduce``...), which stays its one description.

def allreduce(self: Any, tensor: Any, op: OpLike = "sum", *, algo: str | None = None,
              timeout: float | None = None, async_op: bool = False,
              deterministic: bool | None = None, accumulate: str | None = None,
              integrity: bool | None = None, compress: str | None = None,
              out: Any = None) -> Any:
    """Reduce ``tensor`` across all ranks, in place; every rank gets the result.

    ``out``: the result goes there instead and ``tensor`` is left unchanged (same shape,
    dtype and memory; ``out=tensor`` is the in-place call).

    ``deterministic=True``: the result is the rank-order fold of the inputs, bit for bit
    whatever the algorithm, size or placement; ``accumulate``: "fp32" (float16 and
    bfloat16 sums accumulate in float32, rounded once) or "dtype". Both default to the
    communicator's (docs/numerics.md). ``integrity``: check the result end to end
    (True), or not (False); None: as ``PYCOLL_INTEGRITY`` says (docs/integrity.md).
    ``compress``: the wire format ("bf16", "fp16", "fp8", "int8"; default the
    communicator's): float sums only, accumulated in float32, every rank's result the
    same bits, within the bound of docs/numerics.md#compressed-collectives."""
    fast = self._fast
    # out of place or compressed: never the lane below. (The communicator's default
    # ``compress`` needs no test here: a call it compresses is never remembered as a kind.)
    if (fast is not None and out is None and compress is None and algo is None
            and deterministic is None and accumulate is None and integrity is None
            and (not self._integrity_every or (self._exec.seq + 1) % self._integrity_every)):
        arr = tensor if type(tensor) is _ndarray else torch_host_view(tensor)
        if arr is not None:
            call = _known(fast, True, op, arr)
            if call is not None:
                return _run(call.run, arr, timeout, async_op, tensor)
    return self._allreduce(tensor, op, algo, timeout, async_op, deterministic, accumulate,
                           integrity, compress, out=out)


def broadcast(self: Any, tensor: Any, root: int = 0, *, algo: str | None = None,
              timeout: float | None = None, async_op: bool = False,
              integrity: bool | None = None, compress: str | None = None,
              out: Any = None) -> Any:
    """Copy ``tensor`` from ``root`` into ``tensor`` on every other rank.

    ``compress``: the wire format of a float buffer (as for ``allreduce``); every rank,
    the root too, ends with the values the bytes decode to.
    ``out``: the data lands in ``out`` on every rank that passes one (the root's too: a
    copy of its ``tensor``), whose ``tensor`` is left unchanged; a rank other than the
    root that passes ``out`` does not read its ``tensor``, which may be None."""
    fast = self._fast
    if (fast is not None and out is None and compress is None and algo is None
            and type(root) is int and integrity is None
            and (not self._integrity_every or (self._exec.seq + 1) % self._integrity_every)):
        arr = tensor if type(tensor) is _ndarray else torch_host_view(tensor)
        if arr is not None:
            call = _known(fast, False, root, arr)
            if call is not None:
                return _run(call.run, arr, timeout, async_op, tensor)
    return self._broadcast(tensor, root, algo, timeout, async_op, integrity, compress,
                           out=out)


def barrier(self: Any, *, algo: str | None = None, timeout: float | None = None,
            async_op: bool = False) -> Any:
    """Return once every rank has entered the barrier."""
    fast = self._fast
    if fast is not None and algo is None:
        call = fast.barrier_call
        if call is None:
            call = fast.barrier_call = fast.call("barrier", "uint8", 0, 1, None)
        return _run(call.run, fast.barrier_buffer, timeout, async_op, None)
    return self._barrier(algo, timeout, async_op)
