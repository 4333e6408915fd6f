"""The numpy view of the tensor a group's synchronous calls keep passing, remembered.

``dist.all_reduce(t)`` in a loop hands pycoll the same tensor every time, and pycoll's fast
path wants a 1-D numpy array: making one (``torch_host_view``) is a large part of an 8 B
call. The view of the last tensor is kept and reused while that tensor still has the same
memory, dtype, element count and layout, which is much cheaper to tell.

The view holds no reference to the tensor or its storage (it is made over the tensor's
address), so remembering it keeps no memory alive. It is used only after checking that the
tensor it was made for is alive (a weak reference) and still lies where the view points:
then those bytes are the tensor's, for as long as the caller holds it, that is for the call.
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np
import torch

from ..buffers.tensors import torch_host_view


def _dead() -> None:
    return None


#: (weak reference to the tensor, its view, address, dtype, element count): one tuple, set
#: in one assignment, so that a thread never reads one tensor's check with another's view
_Entry = tuple[Any, np.ndarray | None, int, Any, int]
_EMPTY: _Entry = (_dead, None, 0, None, -1)


class HostViews:
    """The view of the last plain dense contiguous CPU tensor asked for (one entry)."""

    __slots__ = ("_entry",)

    def __init__(self) -> None:
        self._entry = _EMPTY

    def get(self, t: torch.Tensor) -> np.ndarray | None:
        """A 1-D numpy view of ``t``'s memory, or None when ``t`` is not a tensor pycoll's
        fast lane takes as an array (``torch_host_view`` says which: then pass ``t``)."""
        ref, view, ptr, dtype, numel = self._entry
        if (ref() is t and t.data_ptr() == ptr and t.dtype is dtype and t.numel() == numel
                and t.is_contiguous()):
            return view
        a = torch_host_view(t)
        if a is None or a.size == 0:
            return a
        ptr = t.data_ptr()
        memory = memoryview((ctypes.c_char * a.nbytes).from_address(ptr)).cast("B")
        view = np.frombuffer(memory, dtype=a.dtype)
        self._entry = (weakref.ref(t), view, ptr, t.dtype, t.numel())
        return view

    def clear(self) -> None:
        """Forget the view (the group is shut down)."""
        self._entry = _EMPTY
