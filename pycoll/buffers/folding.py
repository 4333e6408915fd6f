"""The reduction-order contract: a rank-order left fold, accumulated in float32 for halves.

``deterministic=True`` promises that a reduction's result is, bit for bit, the left fold of
the ranks' inputs in rank order, ``((x0 op x1) op x2) op ...``, element-wise, whatever the
algorithm, message size, chunking, transport or placement (docs/numerics.md). This module is
the one place that computes it (``Fold``): the ordered algorithms
(``algorithms/ordered.py``) and the fast path fold with it, and ``reference`` is the same
fold over whole arrays, for users and tests.

Half precision: float16 and bfloat16 sums (and avg, premul_sum) may accumulate in float32
and round once at the end (``accumulate="fp32"``, the default; NCCL 2.27+ does the same in
its symmetric kernels): each input is widened exactly, the fold runs in float32, avg's scale
too, and the result is rounded to the dtype once, to nearest even. With ``"dtype"`` the fold
runs in the dtype (every step rounded), as the other algorithms do.

Which reductions depend on the order at all: floating-point and complex sum, avg, prod and
premul_sum. Integer arithmetic (wrapping) and min, max and the bitwise ops give the same bits
in any order, so every algorithm already meets the contract for them (``order_matters``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .reduction import ReduceOp, _f32_to_bf16, combiner, finish, needs_finish, reducer

#: accumulate= values: in float32 for float16/bfloat16 sums, or in the buffer's dtype
ACCUMULATE = ("fp32", "dtype")
HALVES = frozenset({"float16", "bfloat16"})
_ORDERED_OPS = frozenset({"sum", "avg", "prod", "premul_sum"})
_WIDE_OPS = frozenset({"sum", "avg", "premul_sum"})
_INEXACT = frozenset({"float16", "bfloat16", "float32", "float64", "complex64", "complex128"})


def check_accumulate(value: str | None, where: str) -> str | None:
    if value is not None and value not in ACCUMULATE:
        raise InvalidArgument(f"{where}: accumulate={value!r} is not one of "
                              f"{', '.join(map(repr, ACCUMULATE))}")
    return value


def order_matters(op: ReduceOp, dtype: str) -> bool:
    """Whether the bits of ``op`` on ``dtype`` depend on the order of the ranks' inputs."""
    return op.name in _ORDERED_OPS and dtype in _INEXACT


def widens(op: ReduceOp, dtype: str, accumulate: str | None) -> bool:
    """Whether ``op`` on ``dtype`` accumulates in float32 (``accumulate``: "fp32"/"dtype")."""
    return accumulate == "fp32" and dtype in HALVES and op.name in _WIDE_OPS


def widen(src: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """``out`` (float32) = ``src`` (float16, or bfloat16 bits as uint16), exactly."""
    if dtype == "bfloat16":
        np.left_shift(src, 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        out[...] = src


def narrow(acc: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """``out`` (the half dtype) = ``acc`` (float32) rounded to nearest even, once."""
    if dtype == "bfloat16":
        _f32_to_bf16(acc, out)
    else:
        out[...] = acc


class Fold:
    """``fold(out, sources, acc)``: ``out`` = the left fold of ``sources`` (rank order), then
    avg's scale, in the accumulation dtype (``acc``: scratch of ``len(out)`` elements of
    ``acc_dtype``; ``out`` may be one of the sources)."""

    def __init__(self, op: ReduceOp, dtype: str, world_size: int, wide: bool) -> None:
        self.op = op
        self.dtype = dtype
        self.world_size = world_size
        self.wide = wide
        self._reduce = reducer(op, "float32" if wide else dtype)
        self._combine = None if wide else combiner(op, dtype)
        self._finish = needs_finish(op, world_size)
        #: the element type of the accumulator (a numpy dtype)
        self.acc_dtype = np.dtype(np.float32) if wide else None

    def __call__(self, out: np.ndarray, sources: Sequence[np.ndarray],
                 acc: np.ndarray | None = None) -> None:
        dtype = self.dtype
        if self.wide:
            assert acc is not None
            widen(sources[0], dtype, acc)
            if dtype == "float16":          # the ufunc widens float16 exactly as it reads
                for src in sources[1:]:
                    self._reduce(acc, src)
            else:
                part = np.empty(acc.size, dtype=np.float32)
                for src in sources[1:]:
                    widen(src, dtype, part)
                    self._reduce(acc, part)
            if self._finish:
                finish(self.op, "float32", acc, self.world_size)
            narrow(acc, dtype, out)
            return
        combine = self._combine
        if combine is None:
            self._fold_copying(out, sources, acc)
        else:
            self._fold_combining(combine, out, sources, acc)
        if self._finish:
            finish(self.op, dtype, out, self.world_size)

    def _fold_combining(self, combine: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
                        out: np.ndarray, sources: Sequence[np.ndarray],
                        acc: np.ndarray | None) -> None:
        """The fold in ``len(sources) - 1`` passes and no copy: the first step out of place
        (``out = s0 op s1``), the others in place; partial results wait in ``acc`` while
        ``out`` is a source still to be read (the rank's own input, at its position)."""
        if len(sources) == 1:
            if out is not sources[0]:
                out[...] = sources[0]
            return
        later = next((i for i in range(len(sources) - 1, 1, -1)
                      if np.may_share_memory(out, sources[i])), 0)
        if later and acc is None:
            acc = np.empty_like(out)
        target: np.ndarray = acc if later and acc is not None else out
        combine(target, sources[0], sources[1])
        for i in range(2, len(sources)):
            if i == later:             # out's own value is read now: the rest goes to out
                combine(out, target, sources[i])
                target = out
            else:
                self._reduce(target, sources[i])

    def _fold_copying(self, out: np.ndarray, sources: Sequence[np.ndarray],
                      acc: np.ndarray | None) -> None:
        """The fold with the in-place reduction only: a copy of the first, then the rest."""
        first = sources[0]
        if acc is None or any(np.may_share_memory(out, s) for s in sources[1:]):
            target = acc if acc is not None else np.empty_like(out)
        else:
            target = out
        if target is not first:
            target[...] = first
        for src in sources[1:]:
            self._reduce(target, src)
        if target is not out:
            out[...] = target


def reference(inputs: Sequence[Any], op: ReduceOp | str = "sum", dtype: str | None = None,
              accumulate: str = "fp32") -> np.ndarray:
    """What ``deterministic=True`` returns for the ranks' ``inputs`` (numpy arrays, rank
    order): the contract's fold over whole arrays. ``dtype`` is the arrays' own, but for
    bfloat16, which numpy carries as uint16 bits: say ``dtype="bfloat16"``. For checking a
    result, or reproducing one without the job."""
    from .reduction import parse_op, prepare
    rop = parse_op(op)
    arrays = [np.array(x).reshape(-1) for x in inputs]
    name = dtype or arrays[0].dtype.name
    for a in arrays:
        prepare(rop, name, a)
    fold = Fold(rop, name, len(arrays), widens(rop, name, accumulate))
    out = np.empty_like(arrays[0])
    acc = np.empty(out.size, dtype=fold.acc_dtype) if fold.acc_dtype is not None else None
    fold(out, arrays, acc)
    return out.reshape(np.shape(inputs[0]))
