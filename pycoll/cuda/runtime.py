"""The CUDA runtime as pycoll uses it: CuPy's raw calls on plain device pointers.

Why raw pointers: a collective meets torch tensors, CuPy arrays, numba device arrays and
foreign ``__cuda_array_interface__`` / ``__dlpack__`` objects. Each names its memory by a
device pointer; the copies (``cudaMemcpyAsync``), events and streams below need nothing
else, so one code path serves them all, and bfloat16 (which CuPy has no dtype for) travels
as its uint16 bits exactly as on the host.

Streams, as NCCL and torch.distributed define them:

* a collective is ordered after the work already queued on the tensor's *current* stream
  (``order_after_caller``: an event recorded there, waited for on pycoll's stream: a GPU-side
  wait, the host does not block);
* it runs on pycoll's own stream (one non-blocking stream per device and process);
* its result is usable on the caller's stream when the call returns (``release_to_caller``:
  the caller's stream waits for an event on pycoll's stream). torch tensors are also marked
  as used on pycoll's stream (``record_stream``), so torch's caching allocator does not hand
  their memory out again while a copy may still read it.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.util
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import debug
from ..envvars import env_bool
from ..errors import InvalidArgument

# cudaMemcpyKind
HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT = 1, 2, 3, 4
# __cuda_array_interface__ v3 "stream" values with a fixed meaning
_CAI_LEGACY_STREAM, _CAI_PER_THREAD_STREAM = 1, 2

_lock = threading.Lock()
_streams: dict[int, Any] = {}           # device -> pycoll's stream on it


_reasons: dict[bool, str | None] = {}     # simulated? -> why device memory is unusable


def unavailable_reason() -> str | None:
    """Why CUDA buffers cannot be used in this process (None: they can). Asked once per mode
    (CuPy, or the simulator): the question initialises CUDA, as ``cudaGetDeviceCount`` does."""
    mode = simulated()
    if mode not in _reasons:
        _reasons[mode] = _find_unavailable_reason(mode)
    return _reasons[mode]


def missing_reason() -> str | None:
    """Why this process could not move device memory, found without initialising CUDA
    (None: it may). The ``cuda_ipc`` probe runs on every rank of every job, host-only jobs
    included: asking for the device count would initialise CUDA there, costing its start-up
    and forbidding fork afterwards. So the probe asks only whether CuPy is installed and the
    driver library loads (loading initialises nothing); whether a device is visible is asked
    when device memory is first used (``unavailable_reason``)."""
    if simulated():
        return None
    try:
        if importlib.util.find_spec("cupy") is None:
            return ("CuPy is not installed; install pycoll's cuda12 or cuda13 extra "
                    "(see docs/cuda.md)")
    except (ImportError, ValueError) as e:
        return f"CuPy cannot be found ({e})"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no CUDA driver ({e})"
    return None


def initialised() -> bool:
    """Whether this process initialised CUDA (pycoll asked for a device): a child it forks
    can no longer use CUDA (``cudaErrorInitializationError``); start those with spawn."""
    return any(why is None for why in _reasons.values())


def simulated() -> bool:
    """Whether ``PYCOLL_CUDA_SIMULATOR`` selects the CPU simulator (``pycoll.cuda.simulator``)
    instead of CuPy and a GPU: CI's device, never a GPU run."""
    return env_bool("PYCOLL_CUDA_SIMULATOR", False)


def runtime_name() -> str:
    """What device memory runs on, as logs and ``pycoll.info`` name it."""
    return "simulator (PYCOLL_CUDA_SIMULATOR=1, not a GPU)" if simulated() else "CuPy"


def _find_unavailable_reason(simulator: bool) -> str | None:
    try:
        cupy = _import_runtime(simulator)
    except ImportError as e:
        return (f"CuPy is not installed ({e}); install pycoll's cuda12 or cuda13 extra "
                "(see docs/cuda.md)")
    except Exception as e:  # noqa: BLE001 - a broken CUDA install raises anything
        return f"CuPy failed to import ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver: cudaErrorInsufficientDriver etc.
        return f"no usable CUDA driver or device ({type(e).__name__}: {e})"
    if count < 1:
        return "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)" + (
            " (pycoll CUDA simulator, not a GPU)" if simulator else "")
    return None


def _import_runtime(simulator: bool) -> Any:
    if simulator:
        from . import simulator as module
        return module
    return importlib.import_module("cupy")


_modules: dict[bool, Any] = {}


def cupy() -> Any:
    """The CuPy module (or the simulator, shaped like it), or a clear error saying how to
    get it."""
    mode = simulated()
    module = _modules.get(mode)
    if module is None:
        why = unavailable_reason()
        if why is not None:
            raise InvalidArgument(f"CUDA buffers cannot be used: {why}")
        module = _modules[mode] = _import_runtime(mode)
        if mode:
            debug.logger.info("CUDA buffers run on %s", runtime_name())
    return module


def storage_dtype(logical: str) -> np.dtype:
    """The numpy dtype whose bits a logical dtype travels as (bfloat16: uint16)."""
    return np.dtype(np.uint16) if logical == "bfloat16" else np.dtype(logical)


def device_pointer(obj: Any, source: str) -> int:
    """The device address of the first element of a classified device buffer."""
    if source == "torch":
        return int(obj.data_ptr())
    if source == "cuda_array_interface":
        return int(obj.__cuda_array_interface__["data"][0])
    # DLPack-only CUDA objects are read through torch (buffers.tensors)
    raise InvalidArgument(f"no device pointer for a {source} buffer")


def current_device_of(obj: Any, source: str, device: int | None) -> int:
    """The device index of a buffer (asking the driver when the object does not say)."""
    if device is not None:
        return device
    ptr = device_pointer(obj, source)
    attrs = cupy().cuda.runtime.pointerGetAttributes(ptr)
    return int(attrs.device)


def caller_stream(obj: Any, source: str, device: int) -> int:
    """The raw handle of the stream the caller's work on ``obj`` is queued on.

    torch: the tensor's device's current stream. A ``__cuda_array_interface__`` that names a
    stream (v3): that one. Otherwise CuPy's current stream on the device.
    """
    if source == "torch":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(device).cuda_stream)
    if source == "cuda_array_interface":
        named = obj.__cuda_array_interface__.get("stream")
        if isinstance(named, int) and named:
            return named   # 1 and 2 are the legacy and per-thread default streams' handles
    cp = cupy()
    with cp.cuda.Device(device):
        return int(cp.cuda.get_current_stream().ptr)


_current = threading.local()


def make_current(device: int) -> None:
    """Make ``device`` (and its primary context) current on this thread with a runtime call.

    Needed before a driver call (``address_range``) on a thread pycoll started (async
    calls run on pycoll's own thread): such a thread has no current context, and CuPy's
    ``with Device(d)`` calls nothing when ``d`` is already the thread's current device, so
    the driver call would fail with ``CUDA_ERROR_INVALID_CONTEXT`` (201). Once per thread
    and device."""
    if getattr(_current, "device", None) != device:
        cupy().cuda.runtime.setDevice(device)
        _current.device = device


def pycoll_stream(device: int) -> Any:
    """pycoll's own non-blocking stream on ``device`` (one per process and device)."""
    stream = _streams.get(device)
    if stream is None:
        cp = cupy()
        with _lock:
            stream = _streams.get(device)
            if stream is None:
                with cp.cuda.Device(device):
                    stream = cp.cuda.Stream(non_blocking=True)
                _streams[device] = stream
    return stream


def order_after_caller(device: int, caller: int) -> None:
    """Make pycoll's stream wait for the work queued so far on the caller's stream.

    The caller's stream is a raw handle, recorded on and waited for with the runtime's calls:
    a CuPy stream object around a stream CuPy does not own would need ``ExternalStream``,
    which CuPy 14 deprecates (a DeprecationWarning each time; CuPy 15 removes it), or
    ``Stream.from_external``, whose object's finaliser is CuPy's own business."""
    cp = cupy()
    with cp.cuda.Device(device):
        event = cp.cuda.Event(disable_timing=True)
        cp.cuda.runtime.eventRecord(event.ptr, caller)
        pycoll_stream(device).wait_event(event)


def release_to_caller(device: int, caller: int, tensors: Sequence[Any] = ()) -> Any:
    """Make the caller's stream wait for what pycoll queued so far; returns the event."""
    cp = cupy()
    ours = pycoll_stream(device)
    with cp.cuda.Device(device):
        event = cp.cuda.Event(disable_timing=True)
        event.record(ours)
        cp.cuda.runtime.streamWaitEvent(caller, event.ptr)
    torch = sys.modules.get("torch")
    if torch is not None:
        mine = None
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                if mine is None:
                    mine = torch.cuda.ExternalStream(ours.ptr, device=t.device)
                t.record_stream(mine)
    return event


def memcpy(dst: int, src: int, nbytes: int, kind: int, device: int) -> None:
    """Queue a copy of ``nbytes`` on pycoll's stream of ``device`` (no host wait)."""
    if nbytes:
        cp = cupy()
        with cp.cuda.Device(device):
            cp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, pycoll_stream(device).ptr)


def synchronize(device: int) -> None:
    """Wait on the host until pycoll's stream on ``device`` is idle."""
    cp = cupy()
    with cp.cuda.Device(device):
        pycoll_stream(device).synchronize()


def pinned(nbytes: int) -> np.ndarray:
    """``nbytes`` of page-locked host memory as a uint8 array (kept alive by the array)."""
    cp = cupy()
    mem = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
    return np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 1))


def device_view(obj: Any, source: str, logical: str, count: int, device: int) -> Any:
    """A 1-D CuPy array over the buffer's memory (no copy; bfloat16 as uint16 bits)."""
    cp = cupy()
    dtype = storage_dtype(logical)
    ptr = device_pointer(obj, source) if count else 0
    mem = cp.cuda.UnownedMemory(ptr, count * dtype.itemsize, obj, device)
    return cp.ndarray((count,), dtype, cp.cuda.MemoryPointer(mem, 0))


_libcuda: Any = None


def driver() -> Any:
    """The CUDA driver library for the calls CuPy has no binding for (``libcuda.so.1``; the
    simulator's stand-in for it under ``PYCOLL_CUDA_SIMULATOR``)."""
    global _libcuda
    cp = cupy()
    if getattr(cp, "SIMULATOR", False):
        return cp.libcuda
    if _libcuda is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                 ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.c_uint64]
        lib.cuMemGetAddressRange_v2.restype = ctypes.c_int
        _libcuda = lib
    return _libcuda


def address_range(ptr: int) -> tuple[int, int]:
    """(base, size) of the allocation holding device address ``ptr`` (``cuMemGetAddressRange``:
    CuPy has no binding for it; numba uses the same driver call). Raises ``DriverError``."""
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    status = driver().cuMemGetAddressRange_v2(ctypes.pointer(base), ctypes.pointer(size),
                                              ctypes.c_uint64(ptr))
    if status != 0:
        raise DriverError(status, f"cuMemGetAddressRange({ptr:#x}) failed with CUresult "
                                  f"{status}" + (" (pycoll CUDA simulator, not a GPU)"
                                                 if simulated() else ""))
    return int(base.value), int(size.value)


class DriverError(RuntimeError):
    """A CUDA driver call failed (``status``: its CUresult)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
