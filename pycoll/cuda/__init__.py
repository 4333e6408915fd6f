"""CUDA buffers: the device runtime (streams, events, copies), device-side reduction
kernels, host staging for transports that move host memory only, and the pieces the CUDA IPC
transport (``pycoll.transports.cuda_ipc``) builds on.

Everything here is imported lazily, only when a collective meets device memory: a host-only
job never imports CuPy. The one runtime is CuPy (the ``cuda`` extra): its raw runtime calls
work on any device pointer, so torch CUDA tensors, CuPy arrays, numba device arrays and any
``__cuda_array_interface__`` / ``__dlpack__`` object go through the same code.
"""
from .runtime import missing_reason, unavailable_reason

__all__ = ["missing_reason", "unavailable_reason"]
