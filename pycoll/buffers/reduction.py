"""Reduction ops and the kernels that apply them: ``dst = dst (op) src``, element-wise.

Kernels stream through memory once (numpy ufuncs with ``out=``, no temporaries) because on one
host the ceiling of a large allreduce is memory bandwidth. bfloat16 arrives as uint16 bits
(numpy has no bfloat16); its kernel widens to float32, reduces, and rounds back to nearest-even.

Averages follow NCCL: the sum is computed first and divided once at the end, by the world
size; integer averages truncate toward zero, like C division.
"""
from __future__ import annotations

import numbers
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import InvalidArgument, InvalidDtype

_INTEGER = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})
_FLOAT = frozenset({"float16", "bfloat16", "float32", "float64"})
# Complex numbers have a sum, a product and a scaling, but no order and no bits: min, max and
# the bitwise ops are refused on them (torch refuses them too).
_COMPLEX = frozenset({"complex64", "complex128"})

# op name -> (ufunc, dtypes it accepts)
_UFUNCS: dict[str, tuple[np.ufunc, frozenset]] = {
    "sum": (np.add, _INTEGER | _FLOAT | _COMPLEX | {"bool"}),
    "avg": (np.add, _INTEGER | _FLOAT | _COMPLEX),
    "premul_sum": (np.add, _FLOAT | _COMPLEX),
    "prod": (np.multiply, _INTEGER | _FLOAT | _COMPLEX | {"bool"}),
    "min": (np.minimum, _INTEGER | _FLOAT | {"bool"}),
    "max": (np.maximum, _INTEGER | _FLOAT | {"bool"}),
    "band": (np.bitwise_and, _INTEGER | {"bool"}),
    "bor": (np.bitwise_or, _INTEGER | {"bool"}),
    "bxor": (np.bitwise_xor, _INTEGER | {"bool"}),
}
OP_NAMES = tuple(_UFUNCS)


@dataclass(frozen=True)
class ReduceOp:
    """A reduction: a name from OP_NAMES and, for ``premul_sum``, the scalar factor.

    Constants as in torch.distributed: ``ReduceOp.SUM``, ``AVG``, ``PROD``, ``MIN``, ``MAX``,
    ``BAND``, ``BOR``, ``BXOR`` (each equal to ``ReduceOp("sum")`` and so on), and
    ``ReduceOp.premul_sum(factor)``: every input multiplied by ``factor``, then summed.
    """

    name: str
    factor: float | None = None

    SUM: ClassVar[ReduceOp]
    AVG: ClassVar[ReduceOp]
    PROD: ClassVar[ReduceOp]
    MIN: ClassVar[ReduceOp]
    MAX: ClassVar[ReduceOp]
    BAND: ClassVar[ReduceOp]
    BOR: ClassVar[ReduceOp]
    BXOR: ClassVar[ReduceOp]

    @staticmethod
    def premul_sum(factor: float) -> ReduceOp:
        """``ReduceOp("premul_sum", factor)``: a sum of the inputs each multiplied by ``factor``."""
        if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
            raise InvalidArgument(f"premul_sum factor must be a number, not {factor!r}")
        return ReduceOp("premul_sum", float(factor))

    def __str__(self) -> str:
        return self.name if self.factor is None else f"{self.name}({self.factor})"


ReduceOp.SUM = ReduceOp("sum")
ReduceOp.AVG = ReduceOp("avg")
ReduceOp.PROD = ReduceOp("prod")
ReduceOp.MIN = ReduceOp("min")
ReduceOp.MAX = ReduceOp("max")
ReduceOp.BAND = ReduceOp("band")
ReduceOp.BOR = ReduceOp("bor")
ReduceOp.BXOR = ReduceOp("bxor")


OpLike = str | ReduceOp


_PARSED: dict[str, ReduceOp] = {}


def parse_op(op: OpLike) -> ReduceOp:
    """Accept "sum"/"SUM"/ReduceOp; reject anything else with the list of valid names."""
    if isinstance(op, str):
        cached = _PARSED.get(op)
        if cached is not None:
            return cached
    if isinstance(op, ReduceOp):
        result = op
    elif isinstance(op, str):
        result = ReduceOp(op.lower())
    else:
        name = getattr(op, "name", None)  # an enum member such as torch's ReduceOp.SUM
        if not isinstance(name, str):
            raise InvalidArgument(f"op must be a string such as 'sum', not {op!r}")
        result = ReduceOp(name.lower())
    if result.name not in _UFUNCS:
        raise InvalidArgument(f"unknown reduction op {result.name!r}; valid ops: "
                              + ", ".join(OP_NAMES))
    if result.name == "premul_sum" and result.factor is None:
        raise InvalidArgument("premul_sum needs a factor: ReduceOp.premul_sum(factor)")
    if isinstance(op, str):
        _PARSED[op] = result
    return result


def check_op_dtype(op: ReduceOp, dtype: str) -> None:
    """Raise InvalidDtype if ``op`` is not defined on ``dtype`` (before any communication)."""
    allowed = _UFUNCS[op.name][1]
    if dtype not in allowed:
        if dtype in _COMPLEX:
            raise InvalidDtype(f"op {op.name!r} is not defined for complex numbers ({dtype}): "
                               "they have no order and no bits; complex tensors take sum, avg, "
                               "prod and premul_sum")
        raise InvalidDtype(f"op {op.name!r} is not supported for dtype {dtype}; it accepts "
                           + ", ".join(sorted(allowed)))


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values: np.ndarray, out: np.ndarray) -> None:
    """Round float32 to bfloat16 bits, nearest-even (NaNs stay NaN)."""
    u = values.view(np.uint32)
    rounding = ((u >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    out[...] = rounded


_HALF_BLOCK = 16384   # elements per block of the numpy half-precision path (stays in L1/L2)


def _torch_half_op(op: ReduceOp, dtype: str) -> tuple[Any, Callable[..., Any], Any] | None:
    """(torch, the torch function that computes ``op``, the torch dtype) for a half
    precision ``dtype``; None unless the program has imported torch.

    Never imported here: importing torch takes seconds (tens of them on a crowded machine,
    every rank importing at once), and this runs inside the first half-precision reduction,
    whose peers wait for it under the collective's deadline. A torch program has torch
    imported already; a numpy program gets numpy's kernel (or imports torch itself first).
    """
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "from_numpy"):    # absent, or still importing
        return None
    kernels: dict[str, Callable[..., Any]] = {
        "sum": torch.add, "avg": torch.add, "premul_sum": torch.add, "prod": torch.mul,
        "min": torch.minimum, "max": torch.maximum}
    return torch, kernels[op.name], torch.bfloat16 if dtype == "bfloat16" else torch.float16


def _torch_half_kernel(op: ReduceOp, dtype: str) -> Callable[[np.ndarray, np.ndarray], None] | None:
    """Half-precision kernels from torch's vectorised CPU code, when torch is imported.

    numpy's float16 ufuncs convert element by element and numpy has no bfloat16 at all;
    torch's vectorised kernels reduce both many times faster on the same memory, zero-copy.
    """
    found = _torch_half_op(op, dtype)
    if found is None:
        return None
    torch, fn, tdtype = found

    def reduce_half_torch(dst: np.ndarray, src: np.ndarray) -> None:
        d = torch.from_numpy(dst).view(tdtype)
        fn(d, torch.from_numpy(src).view(tdtype), out=d)
    return reduce_half_torch


def _numpy_half_kernel(op: ReduceOp, dtype: str) -> Callable[[np.ndarray, np.ndarray], None]:
    """Fallback without torch: widen blocks to float32, reduce, round back (vectorised)."""
    ufunc = _UFUNCS[op.name][0]
    bf16 = dtype == "bfloat16"

    def reduce_half_numpy(dst: np.ndarray, src: np.ndarray) -> None:
        for start in range(0, dst.size, _HALF_BLOCK):
            d, s_ = dst[start:start + _HALF_BLOCK], src[start:start + _HALF_BLOCK]
            if bf16:
                acc = _bf16_to_f32(d)
                ufunc(acc, _bf16_to_f32(s_), out=acc)
                _f32_to_bf16(acc, d)
            else:
                acc = d.astype(np.float32)
                ufunc(acc, s_.astype(np.float32), out=acc)
                d[...] = acc
    return reduce_half_numpy


def combiner(op: ReduceOp, dtype: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray],
                                                   None] | None:
    """``f(out, a, b)``: ``out = a op b`` element-wise, ``out`` free to be ``a`` or ``b``
    (one pass, no copy); None where only the in-place ``reducer`` exists (half precision
    without torch)."""
    if dtype in ("bfloat16", "float16"):
        found = _torch_half_op(op, dtype)
        if found is None:
            return None
        torch, fn, tdtype = found

        def combine_half_torch(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            fn(torch.from_numpy(a).view(tdtype), torch.from_numpy(b).view(tdtype),
               out=torch.from_numpy(out).view(tdtype))
        return combine_half_torch
    ufunc = _UFUNCS[op.name][0]

    def combine_native(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        ufunc(a, b, out=out)
    return combine_native


def reducer(op: ReduceOp, dtype: str) -> Callable[[np.ndarray, np.ndarray], None]:
    """Return ``f(dst, src)`` that does ``dst = dst op src`` in place for this dtype."""
    ufunc = _UFUNCS[op.name][0]
    if dtype in ("bfloat16", "float16"):
        return _torch_half_kernel(op, dtype) or _numpy_half_kernel(op, dtype)

    def reduce_native(dst: np.ndarray, src: np.ndarray) -> None:
        ufunc(dst, src, out=dst)
    return reduce_native


def prepare(op: ReduceOp, dtype: str, array: np.ndarray) -> None:
    """In-place step before the reduction (premul_sum multiplies each input by its factor)."""
    if op.name == "premul_sum":
        if op.factor is None:
            raise InvalidArgument("premul_sum needs a factor: ReduceOp.premul_sum(factor)")
        _scale(array, dtype, op.factor)


def needs_finish(op: ReduceOp, world_size: int) -> bool:
    """Whether ``finish`` does anything for this op (only avg over several ranks does)."""
    return op.name == "avg" and world_size > 1


def finish(op: ReduceOp, dtype: str, array: np.ndarray, world_size: int) -> None:
    """In-place step after the reduction (avg divides the sum by the world size)."""
    if op.name != "avg" or world_size == 1:
        return
    if dtype in _INTEGER:
        if dtype.startswith("u"):
            np.floor_divide(array, world_size, out=array)
        else:  # truncate toward zero, like C and NCCL
            q = np.abs(array) // world_size
            np.multiply(q, np.sign(array), out=array)
    else:
        _scale(array, dtype, 1.0 / world_size)


def _scale(array: np.ndarray, dtype: str, factor: float) -> None:
    if dtype == "bfloat16":
        values = _bf16_to_f32(array)
        values *= np.float32(factor)
        _f32_to_bf16(values, array)
    else:
        np.multiply(array, array.dtype.type(factor), out=array)
