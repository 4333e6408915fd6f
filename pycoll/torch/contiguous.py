"""Contiguous stand-ins for the tensors of one torch call that pycoll cannot use in place.

pycoll reads and writes a tensor's memory as one flat run of bytes, so a non-contiguous
tensor (a column of a matrix, a transposed view) is handed over as a contiguous copy on its
own device, and what the collective wrote there is copied back once the call has succeeded.
Everything else goes to pycoll as it is: contiguous CPU tensors zero copy, and contiguous CUDA
tensors too, because pycoll moves those itself (``pycoll.cuda``: GPU to GPU over cuda_ipc,
else through its reused page-locked buffers), ordered after the tensor's current stream and
released to it. The copy back runs on the current stream, so it is in order with that release.
"""
from __future__ import annotations

import torch

from ..errors import InvalidArgument


class ContiguousStandIns:
    """The stand-ins of one call: ``inp``/``out``/``io`` give pycoll a usable tensor for each
    of the call's tensors, and ``copy_back`` writes the results into the caller's tensors."""

    __slots__ = ("copies",)

    def __init__(self) -> None:
        #: (the caller's tensor, its stand-in) for every tensor the call writes through a copy
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []

    @staticmethod
    def _check(t: torch.Tensor) -> None:
        if not (t.is_cpu or t.is_cuda):
            raise InvalidArgument(f"pycoll backend: tensors on {t.device} are not supported "
                                  "(cpu and cuda are)")

    def inp(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor only read by the collective."""
        self._check(t)
        return t if t.is_contiguous() else t.contiguous()

    def out(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor only written by the collective."""
        self._check(t)
        if t.is_contiguous():
            return t
        stand_in = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        self.copies.append((t, stand_in))
        return stand_in

    def io(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor read and written (in-place collectives)."""
        self._check(t)
        if t.is_contiguous():
            return t
        stand_in = t.contiguous()
        self.copies.append((t, stand_in))
        return stand_in

    def copy_back(self) -> None:
        """Write the stand-ins' contents into the caller's tensors (after a successful call)."""
        for dst, src in self.copies:
            dst.copy_(src)
