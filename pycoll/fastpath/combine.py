"""The element-wise reductions the kernels fold with (numba, compiled into their callers).

``combine`` is the ordinary step, ``acc = acc (op) src``, in place. A rank-order fold
(``deterministic=True``) also needs its first step written where neither input is
(``combine_into``) and a step that puts the accumulator's data on the right
(``combine_left``), so that the larger kernels fold in rank order without copying a byte
more than they do otherwise (``kernels.allreduce_chunked``, ``kernels.allreduce_cma``).
The order only matters for floating-point sums and products: those two get loops of their
own, the other ops go through ``combine``.

numba's on-disk cache of a kernel checks the kernel's own file only (as with
``atomics.py``): after editing this one, clear the cache (``__pycache__/kernels.*.nb*``), or
the kernels keep the old code.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .atomics import copy_bytes, view_as

# (mypy: numba fills in an intrinsic's typing context, and types the local arrays; the
# ignores below say so where this module calls one)

# op codes
OP_NONE = -1                 # exchange only: Python reduces (dtypes numba cannot)
OP_SUM, OP_PROD, OP_MIN, OP_MAX = 0, 1, 2, 3
OP_BAND, OP_BOR, OP_BXOR = 4, 5, 6      # on the bytes: the same for every integer width


@njit(nogil=True, cache=True)
def combine(acc, src, op):
    """``acc = acc (op) src`` element-wise."""
    if op == OP_SUM:
        for i in range(acc.size):
            acc[i] += src[i]
    elif op == OP_PROD:
        for i in range(acc.size):
            acc[i] *= src[i]
    elif op == OP_MIN:           # NaN wins, as in np.minimum
        for i in range(acc.size):
            a, b = acc[i], src[i]
            if not (a < b or a != a):
                acc[i] = b
    elif op == OP_MAX:
        for i in range(acc.size):
            a, b = acc[i], src[i]
            if not (a > b or a != a):
                acc[i] = b
    else:
        a8 = view_as(acc, np.uint8)  # type: ignore[call-arg,var-annotated]
        s8 = view_as(src, np.uint8)
        if op == OP_BAND:
            for i in range(a8.size):
                a8[i] &= s8[i]
        elif op == OP_BOR:
            for i in range(a8.size):
                a8[i] |= s8[i]
        elif op == OP_BXOR:
            for i in range(a8.size):
                a8[i] ^= s8[i]


@njit(nogil=True, cache=True)
def combine_into(out, a, b, op):
    """``out = a (op) b`` element-wise, ``out`` apart from both: the first step of a
    rank-order fold written where neither input is. One pass for sums and products (the
    reductions whose bits depend on the order: the only ones folded in order above one
    slot); the other ops copy, then combine."""
    if op == OP_SUM:
        for i in range(out.size):
            out[i] = a[i] + b[i]
    elif op == OP_PROD:
        for i in range(out.size):
            out[i] = a[i] * b[i]
    else:
        copy_bytes(view_as(out, np.uint8), 0, view_as(a, np.uint8), 0,  # type: ignore[call-arg]
                   out.size * out.itemsize)
        combine(out, b, op)


@njit(nogil=True, cache=True)
def combine_left(acc, src, op):
    """``acc = src (op) acc`` element-wise: ``acc``'s data joins a rank-order fold on the
    right of ``src`` (the fold of the ranks before). In place for sums and products (see
    ``combine_into``); the other ops fold into ``src``, which is scratch, and copy."""
    if op == OP_SUM:
        for i in range(acc.size):
            acc[i] = src[i] + acc[i]
    elif op == OP_PROD:
        for i in range(acc.size):
            acc[i] = src[i] * acc[i]
    else:
        combine(src, acc, op)
        copy_bytes(view_as(acc, np.uint8), 0, view_as(src, np.uint8), 0,  # type: ignore[call-arg]
                   acc.size * acc.itemsize)
