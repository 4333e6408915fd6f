"""Device-side reduction kernels: ``dst = dst (op) src`` element-wise, on pycoll's stream.

CuPy elementwise kernels (compiled by NVRTC on first use, cached by CuPy on disk): one pass
over the data, no temporaries. They follow the host kernels of ``pycoll.buffers.reduction`` exactly,
so a device result equals the CPU reference:

* min and max propagate NaN (numpy's ``minimum``/``maximum``, not C's ``fminf``);
* bool sums are a logical or, products a logical and (numpy's bool ufuncs);
* float16 computes in float32 and rounds once per element; bfloat16 travels as uint16 bits,
  widens to float32 and rounds back to nearest-even, NaNs staying NaN (as on the host);
* avg divides the sum once, at the end; integers truncate toward zero (C division, as NCCL);
* premul_sum multiplies each input by its factor first (``scale``).

Why CuPy rather than numba.cuda or torch ops: one dependency that also gives the runtime
calls (streams, events, IPC handles) and works on any device pointer, torch tensor or not.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..buffers.reduction import ReduceOp
from .runtime import cupy

_INTEGER = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})

# How each op combines y (the destination) with x, written for a type T that C++ orders.
_NATIVE = {
    "sum": "y = y + x", "avg": "y = y + x", "premul_sum": "y = y + x",
    "prod": "y = y * x",
    "min": "y = (x != x || x < y) ? x : y",
    "max": "y = (x != x || x > y) ? x : y",
    "band": "y = y & x", "bor": "y = y | x", "bxor": "y = y ^ x",
}
# bool: numpy's add is or, multiply is and
_BOOL = dict(_NATIVE, sum="y = y || x", prod="y = y && x")
# float math on a = y, b = x (float32), giving r
_FLOAT = {
    "sum": "a + b", "avg": "a + b", "premul_sum": "a + b", "prod": "a * b",
    "min": "(b != b || b < a) ? b : a", "max": "(b != b || b > a) ? b : a",
}
_BF16_IN = ("float a = __uint_as_float(((unsigned int)y) << 16); "
            "float b = __uint_as_float(((unsigned int)x) << 16); ")
_BF16_OUT = ("unsigned int u = __float_as_uint(r); "
             "y = (r != r) ? (unsigned short)((u >> 16) | 0x40u) "
             ": (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);")

_cache: dict[tuple[str, str], Any] = {}


def _kernel(key: tuple[str, str], params_in: str, params_out: str, body: str) -> Any:
    k = _cache.get(key)
    if k is None:
        name = "pycoll_" + "_".join(key).replace("-", "_")
        k = _cache[key] = cupy().ElementwiseKernel(params_in, params_out, body, name)
    return k


def _body(op: str, dtype: str) -> str:
    if dtype == "bfloat16":
        return _BF16_IN + f"float r = {_FLOAT[op]}; " + _BF16_OUT
    if dtype == "float16":
        return f"float a = (float)y; float b = (float)x; float r = {_FLOAT[op]}; y = (T)r;"
    if dtype == "bool":
        return _BOOL[op]
    return _NATIVE[op]


def reducer(op: ReduceOp, dtype: str) -> Callable[[Any, Any], None]:
    """``f(dst, src)``: ``dst = dst op src`` in place, queued on CuPy's current stream."""
    storage = "uint16" if dtype == "bfloat16" else "T"
    k = _kernel((op.name, dtype), f"{storage} x", f"{storage} y", _body(op.name, dtype))

    def reduce_device(dst: Any, src: Any) -> None:
        k(src, dst)
    return reduce_device


def scale(arr: Any, dtype: str, factor: float) -> None:
    """``arr *= factor`` in place (premul_sum's first step, avg's last for floats)."""
    if dtype == "bfloat16":
        k = _kernel(("scale", dtype), "float32 f", "uint16 y",
                    "float a = __uint_as_float(((unsigned int)y) << 16); float r = a * f; "
                    + _BF16_OUT)
        k(cupy().float32(factor), arr)
    elif dtype == "float16":
        k = _kernel(("scale", dtype), "float32 f", "T y", "y = (T)((float)y * f);")
        k(cupy().float32(factor), arr)
    else:
        arr *= arr.dtype.type(factor)


def finish(op: ReduceOp, dtype: str, arr: Any, world_size: int) -> None:
    """avg's division by the world size (once, after the sum); nothing for other ops."""
    if op.name != "avg" or world_size == 1:
        return
    if dtype in _INTEGER:
        k = _kernel(("avg", "int"), "int64 n", "T y", "y = (T)(y / (T)n);")
        k(cupy().int64(world_size), arr)   # C division truncates toward zero
    else:
        scale(arr, dtype, 1.0 / world_size)


def prepare(op: ReduceOp, dtype: str, arr: Any) -> None:
    """premul_sum's step before the reduction: every input times its factor."""
    if op.name == "premul_sum" and op.factor is not None:
        scale(arr, dtype, op.factor)
