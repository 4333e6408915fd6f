"""Windows between threads of one process: origins copy straight into the target's memory.

The window is the target's own buffer in this address space (``windows.MemoryWindow``: a
lock per window makes accumulates and signals atomic with respect to each other). A target
whose transport has closed (its rank finalized or died) is a lost peer.
"""
from __future__ import annotations

from typing import Any

from ...errors import TransportError
from ..windows import MemoryHandle, MemoryWindow


class InprocExposedWindow(MemoryWindow):
    def __init__(self, key: str, wid: int, view: memoryview, rank: int,
                 table: dict[int, InprocExposedWindow]) -> None:
        """``table``: the transport's open windows, which this one leaves when closed."""
        super().__init__(view, rank)
        self._table = table
        self.record = {"key": key, "id": wid}

    def close(self) -> None:
        super().close()
        self._table.pop(int(self.record["id"]), None)


def attach(peer: int, endpoint: Any, record: dict[str, Any]) -> MemoryHandle:
    """The handle on window ``record`` of the peer whose transport is ``endpoint``."""
    target = None
    if endpoint is not None and record.get("key") == endpoint.key:
        target = endpoint.windows.get(int(record.get("id", -1)))
    if target is None:
        raise TransportError(f"inproc: peer rank {peer}'s window is not open in this process",
                             peer=peer)

    def gone() -> str | None:
        return "its transport closed (the rank finalized or failed)" if endpoint.closed else None
    return MemoryHandle(peer, target, gone)
