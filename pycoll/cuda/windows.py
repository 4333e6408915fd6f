"""Device buffers of one-sided window operations (``comm/windows.py``): staged through host.

A transport's window handle moves host bytes (cuda_ipc's copies host bytes into and out of
a peer's mapped device memory), so a device source or destination of a ``put``, ``get`` or
``accumulate`` is copied to or from a host twin at the origin, on pycoll's stream after the
work queued so far on the caller's stream, and waited for: the operation is complete when
it returns, as for host buffers. One extra copy at the origin, none at the target.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..buffers.tensors import Buffer
from ..errors import InvalidArgument
from . import runtime


def stage(buf: Buffer, what: str, reads: bool) -> tuple[np.ndarray, Callable[[], None]]:
    """(the host twin of device buffer ``buf``, the function that copies it back into
    ``buf``); ``reads``: the twin starts with ``buf``'s bytes (a put's or accumulate's
    source), otherwise it is only written (a get's destination)."""
    why = runtime.unavailable_reason()
    if why is not None:
        raise InvalidArgument(f"{what}: the buffer is {buf.where} memory, which this process "
                              f"cannot move: {why}. Nothing was moved.")
    device = runtime.current_device_of(buf.array, buf.source, buf.device)
    ptr = runtime.device_pointer(buf.array, buf.source) if buf.nbytes else 0
    host = np.empty(buf.count, dtype=runtime.storage_dtype(buf.dtype))
    address = int(host.ctypes.data)
    runtime.make_current(device)
    runtime.order_after_caller(device, runtime.caller_stream(buf.array, buf.source, device))
    if reads:
        runtime.memcpy(address, ptr, buf.nbytes, runtime.DEVICE_TO_HOST, device)
        runtime.synchronize(device)

    def back() -> None:
        runtime.memcpy(ptr, address, buf.nbytes, runtime.HOST_TO_DEVICE, device)
        runtime.synchronize(device)       # in the device buffer when the get returns
    return host, back
