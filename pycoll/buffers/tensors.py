"""One adapter from user buffers to what the collectives work on.

Accepted: numpy arrays, torch tensors, anything exposing the buffer protocol (bytearray,
memoryview, array.array), ``__dlpack__``, or ``__cuda_array_interface__`` (cupy, numba
device arrays, torch CUDA tensors). Each is *classified* (memory type, device, logical
dtype) and *validated* (contiguous, supported dtype, writable where results land) before
any byte moves; the communicator then routes it by memory type (``pycoll.buffers.memops``).

Host memory becomes a 1-D, C-contiguous numpy array that aliases the user's memory (zero
copy), plus a *logical* dtype name. The logical name matters for bfloat16: numpy has no such
type, so its bits travel as uint16 and the reduction kernels look at the logical name.
Device memory keeps the user's object (``array``); nothing is ever copied to the host here.
"""
from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from ..errors import InvalidArgument, InvalidDtype
from .memory import CUDA, HOST, MemoryType

# Logical dtype names pycoll can move and reduce.
SUPPORTED_DTYPES = frozenset({
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
})


# numpy's dtype.name is computed in Python on every access (microseconds); look it up instead.
_DTYPE_NAMES = {np.dtype(name): name for name in SUPPORTED_DTYPES if name != "bfloat16"}

# DLPack device types (dlpack.h): the ones whose memory the host can read directly.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


class Buffer(NamedTuple):
    """A user buffer, classified.

    A NamedTuple rather than a dataclass: one is built per collective call, and this is the
    cheapest immutable record Python has.
    """

    array: Any               # host: 1-D contiguous numpy array aliasing the user's memory;
                             # device: the user's object itself
    dtype: str               # logical dtype name ("bfloat16" travels as uint16 bits)
    source: str              # "numpy", "torch", "buffer", "dlpack" or "cuda_array_interface"
    mem_type: MemoryType = HOST
    device: int | None = None
    count_: int = -1         # element count of device buffers (host: array.size)
    itemsize_: int = 0

    @property
    def count(self) -> int:  # type: ignore[override]  # the element count, not tuple.count
        return self.array.size if self.count_ < 0 else self.count_

    @property
    def nbytes(self) -> int:
        return self.array.nbytes if self.count_ < 0 else self.count_ * self.itemsize_

    @property
    def itemsize(self) -> int:
        return self.array.itemsize if self.count_ < 0 else self.itemsize_

    @property
    def where(self) -> str:
        return self.mem_type.label(self.device)


_SUPPORTED_LIST = ", ".join(sorted(SUPPORTED_DTYPES))


def _dtype_name(dtype: np.dtype, name: str) -> str:
    found = _DTYPE_NAMES.get(dtype)
    if found is None:
        raise InvalidDtype(f"{name} has dtype {dtype}, which pycoll does not support; "
                           f"supported: {_SUPPORTED_LIST}")
    return found


def _not_contiguous(name: str, strides: Any, shape: Any, fix: str,
                    kind: str = "C-contiguous") -> InvalidArgument:
    return InvalidArgument(
        f"{name} is not {kind} (strides {strides} for shape {shape}): {fix}; pycoll never "
        "silently copies a buffer it must write back into")


# -- torch ---------------------------------------------------------------------------------
def _torch_dtypes() -> dict:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        return {}
    names = {torch.bool: "bool", torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16",
             torch.int32: "int32", torch.int64: "int64", torch.float16: "float16",
             torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
             torch.complex64: "complex64", torch.complex128: "complex128"}
    for unsigned in ("uint16", "uint32", "uint64"):
        if hasattr(torch, unsigned):
            names[getattr(torch, unsigned)] = unsigned
    return names


_TORCH_DTYPES: dict = {}


def is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def torch_host_view(t: Any) -> np.ndarray | None:
    """A 1-D numpy view of ``t`` when it is a plain dense contiguous CPU torch tensor of a
    dtype numpy has and no autograd history to keep, else None (``as_buffer`` then
    classifies it, and says what is wrong with it if anything is).

    The fast path's lane for torch tensors (``Collectives.allreduce``): ``as_buffer`` and
    the classification after it cost a tenth of a 1 MiB allreduce; this check, a fraction
    of that."""
    torch = sys.modules.get("torch")
    if (torch is None or type(t) is not torch.Tensor or not t.is_cpu or t.requires_grad
            or t.dtype is torch.bfloat16 or t.layout is not torch.strided
            or not t.is_contiguous()):
        return None
    try:
        a = t.numpy()
    except (RuntimeError, TypeError):   # a conjugate or negative view, say
        return None
    return a if a.ndim == 1 else a.reshape(-1)


def _from_torch(t: Any, name: str) -> Buffer:
    global _TORCH_DTYPES
    if not _TORCH_DTYPES:
        _TORCH_DTYPES = _torch_dtypes()
    if not t.is_contiguous():
        raise _not_contiguous(name, tuple(t.stride()), tuple(t.shape), "call .contiguous() first",
                              "contiguous")
    logical = _TORCH_DTYPES.get(t.dtype)
    if logical is None:
        raise InvalidDtype(f"{name}: torch dtype {t.dtype} is not supported; supported: "
                           f"{_SUPPORTED_LIST}")
    if t.layout != sys.modules["torch"].strided:
        raise InvalidArgument(f"{name}: torch layout {t.layout} is not supported (dense "
                              "tensors only)")
    device = t.device
    if device.type == "cuda":
        return Buffer(t, logical, "torch", CUDA, device.index, t.numel(), t.element_size())
    if device.type != "cpu":
        raise InvalidArgument(f"{name} is on device {device}, which pycoll does not move; "
                              "use a CPU or CUDA tensor")
    t = t.detach()
    if logical == "bfloat16":
        import torch
        return Buffer(t.view(torch.int16).numpy().view(np.uint16).reshape(-1), "bfloat16", "torch")
    return Buffer(t.numpy().reshape(-1), logical, "torch")


# -- device memory without torch -----------------------------------------------------------
def _cuda_device_of(obj: Any) -> int | None:
    """The device index of a cupy / numba array (None when the object does not say)."""
    dev = getattr(obj, "device", None)
    index = getattr(dev, "id", None)
    if isinstance(index, int):
        return index
    return None


def _from_cuda_array_interface(obj: Any, name: str) -> Buffer:
    cai = obj.__cuda_array_interface__
    try:
        dtype = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
    except (KeyError, TypeError) as e:
        raise InvalidArgument(f"{name}: malformed __cuda_array_interface__ ({e})") from None
    logical = _dtype_name(dtype, name)
    strides = cai.get("strides")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if strides is not None and count > 1:
        expected, step = [], dtype.itemsize
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        if tuple(s for s, d in zip(strides, shape) if d > 1) != \
                tuple(s for s, d in zip(reversed(expected), shape) if d > 1):
            raise _not_contiguous(name, tuple(strides), shape, "make it C-contiguous first")
    return Buffer(obj, logical, "cuda_array_interface", CUDA, _cuda_device_of(obj), count,
                  dtype.itemsize)


def _from_dlpack(obj: Any, name: str) -> Buffer:
    try:
        dev_type, dev_id = obj.__dlpack_device__()
    except Exception as e:  # noqa: BLE001 - a foreign object's method
        raise InvalidArgument(f"{name}: __dlpack_device__() failed: {e}") from None
    if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        if hasattr(obj, "__cuda_array_interface__"):
            return _from_cuda_array_interface(obj, name)
        return _from_cuda_dlpack(obj, name, int(dev_id))
    if dev_type not in (_DL_CPU, _DL_CUDA_HOST):
        raise InvalidArgument(f"{name}: DLPack device type {dev_type} is not host or CUDA "
                              "memory; pycoll cannot move it")
    try:
        arr = np.from_dlpack(obj)
    except (BufferError, TypeError, RuntimeError) as e:
        raise InvalidDtype(f"{name}: numpy cannot view this DLPack tensor ({e}); supported "
                           f"dtypes: {_SUPPORTED_LIST}") from None
    return _host_array(arr, name, "dlpack")


def _from_cuda_dlpack(obj: Any, name: str, device: int) -> Buffer:
    """A CUDA tensor known only through DLPack: its dtype, size and pointer are in the
    capsule, which torch reads (the tensor then shares the producer's memory). Without
    torch it is refused: taken blind, its size was unknown and a call moved nothing."""
    why = "torch is not installed"
    try:
        import torch
        return _from_torch(torch.from_dlpack(obj), name)
    except ImportError:
        pass
    except InvalidArgument:
        raise
    except Exception as e:  # noqa: BLE001 - a foreign object's __dlpack__, torch's checks
        why = f"torch.from_dlpack failed: {type(e).__name__}: {e}"
    raise InvalidArgument(
        f"{name}: a CUDA tensor (cuda:{device}) seen only through DLPack, which pycoll could "
        f"not read ({why}); pass a torch tensor (torch.from_dlpack(x)), a CuPy array "
        "(cupy.from_dlpack(x)) or an object with __cuda_array_interface__")


def _host_array(arr: np.ndarray, name: str, source: str) -> Buffer:
    if not (arr.flags.c_contiguous or arr.size <= 1):
        raise _not_contiguous(name, arr.strides, arr.shape,
                              "pass np.ascontiguousarray(x) and copy the result back")
    dtype = _dtype_name(arr.dtype, name)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return Buffer(arr, dtype, source)


def _from_buffer_protocol(obj: Any, name: str) -> Buffer:
    try:
        view = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            f"{name} must be a numpy array, a torch tensor, or an object with the buffer "
            "protocol, __dlpack__ or __cuda_array_interface__; not "
            f"{type(obj).__name__}") from None
    if not view.c_contiguous:
        raise _not_contiguous(name, view.strides, view.shape, "copy it into a contiguous buffer")
    try:
        arr = np.asarray(view)
    except (ValueError, TypeError) as e:
        raise InvalidDtype(f"{name}: buffer format {view.format!r} is not understood ({e})"
                           ) from None
    return _host_array(arr, name, "buffer")


def as_buffer(obj: Any, *, name: str = "tensor", writable: bool = True) -> Buffer:
    """Classify and validate ``obj``; raise a clear error before any I/O.

    ``writable`` is required for buffers that receive results (in-place collectives).
    """
    if type(obj) is np.ndarray:          # the hot path, inlined: no attribute probing
        dtype = _DTYPE_NAMES.get(obj.dtype)
        if dtype is not None and obj.flags.c_contiguous:
            if writable and not obj.flags.writeable:
                raise InvalidArgument(f"{name} is read-only, but this collective writes its "
                                      "result into it")
            return Buffer(obj if obj.ndim == 1 else obj.reshape(-1), dtype, "numpy")
        buf = _host_array(obj, name, "numpy")
    elif isinstance(obj, np.ndarray):
        buf = _host_array(obj, name, "numpy")
    elif is_torch_tensor(obj):
        buf = _from_torch(obj, name)
    elif hasattr(obj, "__cuda_array_interface__"):
        buf = _from_cuda_array_interface(obj, name)
    elif hasattr(obj, "__dlpack_device__") and not isinstance(obj, (bytes, bytearray, memoryview)):
        buf = _from_dlpack(obj, name)
    else:
        buf = _from_buffer_protocol(obj, name)
    if writable and buf.mem_type == HOST and not buf.array.flags.writeable:
        raise InvalidArgument(f"{name} is read-only, but this collective writes its result into it")
    return buf
