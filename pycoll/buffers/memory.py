"""What crosses the transport boundary: a reference to memory, not a ``memoryview``.

A ``MemRef`` says where the bytes are (address, length), what kind of memory holds them
(host, or a CUDA device and its index), which object owns them (kept alive while a request
is in flight), and for device memory the stream event after which the data is valid. A
transport reads only what it needs: tcp and shm want a host ``memoryview`` (zero-copy
``sendmsg``/``recv_into``, slot copies) and, for cross-memory attach, the address; a verbs
transport wants the address and length to register; a CUDA IPC transport wants the device
pointer and the ready event. This is UCX's memory-type detection and Gloo's UnboundBuffer in
one small record.

The host case is the hot path (every message of every collective), so a host ``MemRef``
wraps a byte ``memoryview`` and computes its address only when asked.
"""
from __future__ import annotations

import ctypes
import enum
from typing import Any


class MemoryType(enum.IntEnum):
    """Kinds of memory a transport may declare it moves."""

    HOST = 0
    CUDA = 1

    def label(self, device: int | None = None) -> str:
        if self is MemoryType.HOST:
            return "host"
        return f"cuda:{device}" if device is not None else "cuda"


HOST = MemoryType.HOST
CUDA = MemoryType.CUDA


def view_address(view: memoryview) -> int:
    """The address of a byte view's first byte (read-only views too)."""
    if view.readonly:
        import numpy as np
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0
    if not view.nbytes:
        return 0
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class MemRef:
    """``nbytes`` bytes at ``ptr`` in memory of type ``mem_type`` (and ``device``).

    ``owner`` keeps the memory alive while a request uses it; ``ready`` is, for device
    memory, the event (or stream) after which the bytes are valid (None: valid now).
    ``sub(offset, n)`` is cheap: no copy, same owner.

    A plain ``MemRef`` is host memory seen through a byte ``memoryview`` (which itself keeps
    its exporter alive): the hot path, one per message, so it stores two fields and takes
    the rest from class defaults. ``DeviceMemRef`` carries everything explicitly.
    """

    __slots__ = ("view", "nbytes")
    mem_type: MemoryType = HOST
    device: int | None = None
    owner: Any = None
    ready: Any = None

    def __init__(self, view: memoryview) -> None:
        #: the bytes (host memory); None for device memory (``DeviceMemRef``), which is
        #: how a ``Request`` tells the two apart without raising (``host_view`` raises)
        self.view = view
        self.nbytes = view.nbytes

    @classmethod
    def of(cls, obj: Any) -> MemRef:
        """Host memory of any buffer-protocol object (bytes, bytearray, numpy...)."""
        view = memoryview(obj)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        return cls(view)

    @staticmethod
    def device_memory(ptr: int, nbytes: int, device: int | None, owner: Any = None,
                      ready: Any = None, mem_type: MemoryType = CUDA) -> DeviceMemRef:
        """A reference to device memory (no host view)."""
        return DeviceMemRef(ptr, nbytes, mem_type, device, owner, ready)

    @property
    def ptr(self) -> int:
        return view_address(self.view)

    def host_view(self) -> memoryview:
        """The bytes as a ``memoryview`` (host memory only)."""
        return self.view

    def sub(self, offset: int, nbytes: int) -> MemRef:
        """``nbytes`` bytes from ``offset`` (same memory, same owner)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"sub({offset}, {nbytes}) outside a {self.nbytes}-byte MemRef")
        return MemRef(self.view[offset:offset + nbytes])

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        return f"<MemRef {self.nbytes} B {self.mem_type.label(self.device)}>"


class DeviceMemRef(MemRef):
    """Device memory: a pointer, no host view, and the event after which it is valid."""

    __slots__ = ("_ptr", "mem_type", "device", "owner", "ready")

    def __init__(self, ptr: int, nbytes: int, mem_type: MemoryType, device: int | None,
                 owner: Any = None, ready: Any = None) -> None:
        self.view = None        # type: ignore[assignment]
        self.nbytes = nbytes
        self._ptr = ptr
        self.mem_type = mem_type
        self.device = device
        self.owner = owner
        self.ready = ready

    @property
    def ptr(self) -> int:
        return self._ptr

    def host_view(self) -> memoryview:
        raise TypeError(f"{self.mem_type.label(self.device)} memory has no host view; "
                        "this transport does not move device memory")

    def sub(self, offset: int, nbytes: int) -> MemRef:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"sub({offset}, {nbytes}) outside a {self.nbytes}-byte MemRef")
        return DeviceMemRef(self._ptr + offset, nbytes, self.mem_type, self.device, self.owner,
                            self.ready)
