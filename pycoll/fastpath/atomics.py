"""Memory-ordering primitives and the futex for the compiled kernels (numba intrinsics).

The fast path's flags live in shared memory that other processes read and write. Plain loads
and stores are not enough on weakly ordered CPUs (ARM, POWER): a reader could see a flag
before the data it publishes. So every flag is written with a *release* store and read with
an *acquire* load, and the sleep/wake hand-shake uses sequentially consistent fences, all
emitted as LLVM atomics: on x86-64 they compile to plain moves (plus one ``mfence``), on
AArch64 to ``stlr``/``ldar`` and ``dmb``. Nothing here assumes x86's store order.

Sleeping uses the Linux futex on a 32-bit word of the shared segment (not
``FUTEX_PRIVATE_FLAG``: the waiters are different processes), called through libc's
``syscall`` so that compiled functions that use it can be cached on disk.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

#: futex(2) system call numbers; other Linux architectures are refused by ``supported``
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine(), -1)
FUTEX_WAIT = 0
FUTEX_WAKE = 1
#: process_vm_readv(2) and process_vm_writev(2): cross-memory attach, a single copy out of
#: (into) a peer's buffer
SYS_PROCESS_VM_READV = {"x86_64": 310, "aarch64": 270}.get(platform.machine(), -1)
SYS_PROCESS_VM_WRITEV = {"x86_64": 311, "aarch64": 271}.get(platform.machine(), -1)

syscall6 = types.ExternalFunction(
    "syscall", types.int64(types.int64, types.int64, types.int64, types.int64, types.int64,
                           types.int64))
#: the same, with room for a sixth system call argument (process_vm_readv's flags, which must
#: be 0: with ``syscall6`` the kernel would read whatever the register held)
syscall7 = types.ExternalFunction("syscall", types.int64(*[types.int64] * 7))
sched_yield = types.ExternalFunction("sched_yield", types.int32())


def _element_pointer(context, builder, array_type, array, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def load_acquire(typingctx, array, index):
    """``array[index]`` with acquire ordering: later reads see what the writer published."""
    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", signature.args[0].dtype.bitwidth // 8)
    return array.dtype(array, index), codegen


@intrinsic
def store_release(typingctx, array, index, value):
    """``array[index] = value`` with release ordering: earlier writes become visible first."""
    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ptr = _element_pointer(context, builder, aty, args[0], args[1])
        val = context.cast(builder, args[2], signature.args[2], aty.dtype)
        builder.store_atomic(val, ptr, "release", aty.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.void(array, index, value), codegen


@intrinsic
def fetch_add(typingctx, array, index, value):
    """Atomically ``array[index] += value`` (sequentially consistent); returns the old value."""
    def codegen(context, builder, signature, args):
        aty = signature.args[0]
        ptr = _element_pointer(context, builder, aty, args[0], args[1])
        val = context.cast(builder, args[2], signature.args[2], aty.dtype)
        return builder.atomic_rmw("add", ptr, val, "seq_cst")
    return array.dtype(array, index, value), codegen


@intrinsic
def full_fence(typingctx):
    """A sequentially consistent fence (a store before it is visible before a load after)."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def address_of(typingctx, array, index):
    """The address of ``array[index]`` as an int (for the futex system call)."""
    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.ptrtoint(ptr, ir.IntType(64))
    return types.int64(array, index), codegen


def _unowned_array(context, builder, elem, data, count):
    """A 1-D C array of ``count`` ``elem`` at pointer ``data`` that owns no reference (its
    memory info is null, as for ``numba.carray``): valid while whatever owns the memory is."""
    out = context.make_array(types.Array(elem, 1, "C"))(context, builder)
    intp = context.get_value_type(types.intp)
    item = ir.Constant(intp, context.get_abi_sizeof(context.get_data_type(elem)))
    data = builder.bitcast(data, context.get_data_type(elem).as_pointer())
    populate_array(out, data=data, shape=[count], strides=[item], itemsize=item, meminfo=None)
    return out._getvalue()


@intrinsic
def view_as(typingctx, array, dtype):
    """``array`` (1-D, C-contiguous) seen as elements of ``dtype``: ``array.view(dtype)``
    without the reference counting. numba's ``view`` takes a reference on the array's memory
    info (an atomic increment, and a decrement later) and checks the new shape: the five or
    six views of an 8-byte allreduce were most of its compiled time. The view made
    here owns no reference: it is valid while ``array`` is, which in the kernels is the whole
    call (views of their own arguments). A trailing partial element is left out."""
    if not isinstance(array, types.Array) or array.ndim != 1 or array.layout != "C":
        return None
    elem = getattr(dtype, "dtype", None)
    if elem is None:
        return None

    def codegen(context, builder, signature, args):
        src = context.make_array(signature.args[0])(context, builder, args[0])
        intp = context.get_value_type(types.intp)
        src_item = context.get_abi_sizeof(context.get_data_type(signature.args[0].dtype))
        item = context.get_abi_sizeof(context.get_data_type(elem))
        nbytes = builder.mul(builder.extract_value(src.shape, 0), ir.Constant(intp, src_item))
        count = builder.udiv(nbytes, ir.Constant(intp, item))
        return _unowned_array(context, builder, elem, src.data, count)
    return types.Array(elem, 1, "C")(array, dtype), codegen


@intrinsic
def bytes_at(typingctx, address, nbytes):
    """The ``nbytes`` bytes at ``address`` as a uint8 array that owns no reference (like
    ``view_as``): for memory the caller keeps mapped for as long as the kernel runs."""
    if not isinstance(address, types.Integer) or not isinstance(nbytes, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = builder.inttoptr(args[0], ir.IntType(8).as_pointer())
        count = context.cast(builder, args[1], signature.args[1], types.intp)
        return _unowned_array(context, builder, types.uint8, data, count)
    return types.Array(types.uint8, 1, "C")(address, nbytes), codegen


_RELAX = platform.machine()


@intrinsic
def cpu_relax(typingctx):
    """The spin-wait hint (``pause`` / ``yield``, as LLVM intrinsics): lets the sibling
    hyper-thread run and saves the pipeline flush when the awaited line changes."""
    def codegen(context, builder, signature, args):
        module = builder.module
        if _RELAX == "x86_64":
            fn = module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(
                ir.VoidType(), []))
            builder.call(fn, [])
        elif _RELAX == "aarch64":
            fn = module.declare_intrinsic("llvm.aarch64.hint", fnty=ir.FunctionType(
                ir.VoidType(), [ir.IntType(32)]))
            builder.call(fn, [ir.Constant(ir.IntType(32), 1)])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def copy_bytes(typingctx, dst, dst_index, src, src_index, nbytes):
    """memcpy ``nbytes`` from ``src[src_index]`` to ``dst[dst_index]`` (the LLVM intrinsic:
    numba's slice copy goes byte by byte, this one at the cache's speed)."""
    def codegen(context, builder, signature, args):
        d = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        s = _element_pointer(context, builder, signature.args[2], args[2], args[3])
        i8p = ir.IntType(8).as_pointer()
        count = context.cast(builder, args[4], signature.args[4], types.intp)
        cgutils.raw_memcpy(builder, builder.bitcast(d, i8p), builder.bitcast(s, i8p), count, 1)
        return context.get_dummy_value()
    return types.void(dst, dst_index, src, src_index, nbytes), codegen
