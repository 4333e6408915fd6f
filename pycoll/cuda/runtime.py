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

import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument

# cudaMemcpyKind
HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT = 1, 2, 3, 4
# __cuda_array_interface__ v3 "stream" values with a fixed meaning
_CAI_LEGACY_STREAM, _CAI_PER_THREAD_STREAM = 1, 2

_cupy: Any = None
_lock = threading.Lock()
_streams: dict[int, Any] = {}           # device -> pycoll's stream on it
_external: dict[tuple[int, int], Any] = {}   # (device, handle) -> cupy ExternalStream


_UNKNOWN = "?"
_reason: str | None = _UNKNOWN


def unavailable_reason() -> str | None:
    """Why CUDA buffers cannot be used in this process (None: they can). Asked once."""
    global _reason
    if _reason is _UNKNOWN:
        _reason = _find_unavailable_reason()
    return _reason


def _find_unavailable_reason() -> str | None:
    try:
        import cupy  # noqa: F401
    except ImportError as e:
        return (f"CuPy is not installed ({e}); install pycoll's cuda extra: "
                "pip install 'pycoll[cuda]'")
    except Exception as e:  # noqa: BLE001 - a broken CUDA install raises anything
        return f"CuPy failed to import ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver: cudaErrorInsufficientDriver etc.
        return f"no usable CUDA driver or device ({type(e).__name__}: {e})"
    if count < 1:
        return "no CUDA device is visible (CUDA_VISIBLE_DEVICES?)"
    return None


def cupy() -> Any:
    """The CuPy module, or a clear error saying how to get it."""
    global _cupy
    if _cupy is None:
        why = unavailable_reason()
        if why is not None:
            raise InvalidArgument(f"CUDA buffers cannot be used: {why}")
        import cupy as cp
        _cupy = cp
    return _cupy


def storage_dtype(logical: str) -> np.dtype:
    """The numpy dtype whose bits a logical dtype travels as (bfloat16: uint16)."""
    return np.dtype(np.uint16) if logical == "bfloat16" else np.dtype(logical)


def device_pointer(obj: Any, source: str) -> int:
    """The device address of the first element of a classified device buffer."""
    if source == "torch":
        return int(obj.data_ptr())
    if source == "cuda_array_interface":
        return int(obj.__cuda_array_interface__["data"][0])
    return int(cupy().from_dlpack(obj).data.ptr)


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


def external_stream(device: int, handle: int) -> Any:
    """A CuPy stream object for a raw handle (cached: one object per handle)."""
    key = (device, handle)
    stream = _external.get(key)
    if stream is None:
        cp = cupy()
        with cp.cuda.Device(device):
            stream = cp.cuda.ExternalStream(handle)
        if len(_external) < 1024:
            _external[key] = stream
    return stream


def order_after_caller(device: int, caller: int) -> None:
    """Make pycoll's stream wait for the work queued so far on the caller's stream."""
    cp = cupy()
    with cp.cuda.Device(device):
        event = cp.cuda.Event(disable_timing=True)
        event.record(external_stream(device, caller))
        pycoll_stream(device).wait_event(event)


def release_to_caller(device: int, caller: int, tensors: Sequence[Any] = ()) -> Any:
    """Make the caller's stream wait for what pycoll queued so far; returns the event."""
    cp = cupy()
    ours = pycoll_stream(device)
    with cp.cuda.Device(device):
        event = cp.cuda.Event(disable_timing=True)
        event.record(ours)
        external_stream(device, caller).wait_event(event)
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
