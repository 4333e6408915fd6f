"""Error feedback for compressed allreduce in training (``compress=``, docs/numerics.md).

A compressed allreduce rounds every rank's input once on the wire. In training, rounding the
same gradient the same way step after step biases the update: a component smaller than its
block's quantum is lost *every* step. Error feedback (Seide et al. 2014; Karimireddy et al.
2019) keeps what this rank's rounding lost and adds it to the next step's input, so that the
loss is delayed by one step instead of dropped::

    ef = pycoll.compress.ErrorFeedback("fp8")
    ef.compensate("layer1", grad)          # grad += residual; residual = grad - q(grad)
    comm.allreduce(grad, "avg", compress="fp8")

What is stored: one array per key (a gradient bucket, a tensor name), the input's shape and
dtype, holding ``x - decode(encode(x))`` of the last compensated ``x``; the memory cost is one
copy of every compensated gradient, on every rank. The residual is per rank: each rank
quantises only its own input, so each keeps its own residual and nothing about it is
communicated. What it does not cover: the owner's quantisation of the *result* (the same on
every rank; its error stays within the bound of docs/numerics.md but is not fed back).

``compensate`` quantises ``x`` here, on the same block grid as the collective (blocks start
at the buffer's first element: ``buffers/compression.py``), so the residual is exactly what
this rank's input loses in the call: that costs one extra encode and decode of the buffer.
"""
from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from .buffers.compression import codec, reference_encode_decode
from .errors import InvalidArgument

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """The residuals of one rank's compressed inputs, one per key (see the module doc).

    ``fmt``: the wire format of the allreduce the compensated inputs go to ("bf16", "fp16",
    "fp8", "int8"). A key whose input changes shape or dtype (DDP rebuilds its buckets after
    the first step) starts again from a zero residual."""

    def __init__(self, fmt: str) -> None:
        codec(fmt)                           # refuses an unknown format now, not at step 1
        self.fmt = fmt
        self._residuals: dict[Hashable, np.ndarray] = {}

    def compensate(self, key: Hashable, x: np.ndarray) -> None:
        """In place: ``x += residual[key]``; then ``residual[key] = x - decode(encode(x))``.

        ``x``: a contiguous float32 or float64 array, the input of the next compressed call
        (float16/bfloat16 gradients: keep float32 ones, or compensate a float32 copy)."""
        if x.dtype not in (np.float32, np.float64) or not x.flags.c_contiguous:
            raise InvalidArgument(f"ErrorFeedback.compensate({key!r}): needs a contiguous "
                                  f"float32 or float64 array, got {x.dtype} "
                                  f"(contiguous: {x.flags.c_contiguous})")
        r = self._residuals.get(key)
        if r is not None and r.shape == x.shape and r.dtype == x.dtype:
            x += r
        else:
            r = np.empty_like(x)
            self._residuals[key] = r
        decoded = reference_encode_decode(x, self.fmt).reshape(x.shape)
        np.subtract(x, decoded, out=r)
        # non-finite inputs: the step is already lost; do not carry NaN into every later one
        r[~np.isfinite(r)] = 0.0

    def residual(self, key: Hashable) -> np.ndarray | None:
        """The residual kept for ``key`` (None before its first ``compensate``)."""
        return self._residuals.get(key)

    def reset(self) -> None:
        """Forget every residual (e.g. after loading a checkpoint)."""
        self._residuals.clear()

    @property
    def nbytes(self) -> int:
        """The memory the residuals take on this rank."""
        return sum(r.nbytes for r in self._residuals.values())
