"""One adapter from user tensors (numpy arrays, torch CPU tensors) to flat numpy views.

Everything below this module works on a 1-D, C-contiguous numpy array that aliases the
user's memory (zero copy), plus a *logical* dtype name. The logical name matters for
bfloat16: numpy has no such type, so its bits travel as uint16 and the reduction kernels
look at the logical name to do the arithmetic right.
"""
from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from .errors import InvalidArgument, InvalidDtype

# Logical dtype names pycoll can move and reduce.
SUPPORTED_DTYPES = frozenset({
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64",
})


# numpy's dtype.name is computed in Python on every access (microseconds); look it up instead.
_DTYPE_NAMES = {np.dtype(name): name for name in SUPPORTED_DTYPES if name != "bfloat16"}


class Buffer(NamedTuple):
    """A user tensor seen as a flat numpy array that shares its memory.

    A NamedTuple rather than a dataclass: one is built per collective call, and this is the
    cheapest immutable record Python has.
    """

    array: np.ndarray        # 1-D, contiguous, aliases the user's memory
    dtype: str               # logical dtype name ("bfloat16" travels as uint16 bits)
    source: str              # "numpy" or "torch"

    @property
    def count(self) -> int:
        return int(self.array.size)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    @property
    def itemsize(self) -> int:
        return int(self.array.itemsize)


def _torch_to_numpy(t: Any) -> tuple[np.ndarray, str]:
    import torch  # only reached when the caller already passed a torch tensor

    if t.device.type != "cpu":
        raise InvalidArgument(
            f"tensor is on device {t.device}; this pycoll build moves CPU tensors only "
            "(CUDA tensors come with the CUDA transport): call .cpu() first")
    if not t.is_contiguous():
        raise InvalidArgument(
            "tensor is not contiguous (strides %s for shape %s): call .contiguous() first; "
            "pycoll never silently copies a tensor it must write back into"
            % (tuple(t.stride()), tuple(t.shape)))
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).reshape(-1), "bfloat16"
    if t.is_complex() or t.dtype not in _TORCH_DTYPES:
        raise InvalidDtype(f"torch dtype {t.dtype} is not supported; supported: "
                           + ", ".join(sorted(SUPPORTED_DTYPES)))
    arr = t.numpy().reshape(-1)
    return arr, _DTYPE_NAMES[arr.dtype]


def _torch_dtypes() -> frozenset:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is optional
        return frozenset()
    return frozenset({torch.bool, torch.int8, torch.uint8, torch.int16, torch.int32,
                      torch.int64, torch.float16, torch.float32, torch.float64,
                      getattr(torch, "uint16", torch.int16), getattr(torch, "uint32", torch.int32),
                      getattr(torch, "uint64", torch.int64)})


_TORCH_DTYPES: frozenset = frozenset()


def is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def as_buffer(obj: Any, *, name: str = "tensor", writable: bool = True) -> Buffer:
    """Return a zero-copy flat view of ``obj`` or raise a clear error before any I/O.

    ``writable`` is required for buffers that receive results (in-place collectives).
    """
    global _TORCH_DTYPES
    if isinstance(obj, np.ndarray):
        arr, source = obj, "numpy"
        if not (arr.flags.c_contiguous or arr.size <= 1):
            raise InvalidArgument(
                f"{name} is not C-contiguous (strides {arr.strides} for shape {arr.shape}): "
                "pass np.ascontiguousarray(x) and copy the result back")
        dtype = _DTYPE_NAMES.get(arr.dtype)
        if dtype is None:
            raise InvalidDtype(f"{name} has dtype {arr.dtype}, which pycoll does not support; "
                               "supported: " + ", ".join(sorted(SUPPORTED_DTYPES)))
        if arr.ndim != 1:
            arr = arr.reshape(-1)
    elif is_torch_tensor(obj):
        if not _TORCH_DTYPES:
            _TORCH_DTYPES = _torch_dtypes()
        arr, dtype = _torch_to_numpy(obj)
        source = "torch"
    else:
        raise InvalidArgument(
            f"{name} must be a numpy array or a torch tensor, not {type(obj).__name__}")
    if writable and not arr.flags.writeable:
        raise InvalidArgument(f"{name} is read-only, but this collective writes its result into it")
    return Buffer(arr, dtype, source)
