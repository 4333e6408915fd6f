"""How many processes wait to join the job, read from the launcher's own store server.

A replacement that ``pycoll.run --max-restarts`` started joins with ``pycoll.init()`` under
``PYCOLL_JOIN=1`` (or ``pycoll.torch.join_group()``): it waits in the lobby of the world
communicator (or the torch backend's; ``comm/lobby.py``) until the survivors call
``grow``. Once only such waiting processes are left, nobody can admit them,
and the elastic policy ends them instead of letting each wait for its ``init`` deadline.
Node 0's launcher hosts the store, so it reads the lobby without a connection
(``StoreServer.peek``), through the same ``Lobby`` the ranks use; the other hosts' launchers
read it through their store client.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rendezvous import StoreServer

#: the communicators a replacement joins: ``pycoll.init(join=True)``'s default world, and
#: the torch backend's default group (``pycoll.torch.join_group``)
JOINABLE = ("world", "torch")


class _PeekStore:
    """The reads ``Lobby.waiting`` makes, answered from the server's own table."""

    def __init__(self, server: StoreServer) -> None:
        self.server = server

    def check(self, keys: Sequence[str]) -> bool:
        return all(self.server.peek(k) is not None for k in keys)

    def get(self, key: str) -> bytes:
        value = self.server.peek(key)
        if value is None:
            raise KeyError(key)
        return value

    def multi_get(self, keys: Sequence[str], timeout: float | None = None) -> list[bytes]:
        del timeout                  # a read of the table never waits
        return [self.get(k) for k in keys]


def waiting_joiners(server: StoreServer) -> int:
    """Processes in the joinable communicators' lobbies now: queued, alive, not admitted."""
    return joiners_in(_PeekStore(server))


def joiners_in(store: Any) -> int:
    """The same, read through ``store`` (a launcher on another host than the store's)."""
    from ..comm.lobby import Lobby

    return sum(len(Lobby(store, name).waiting()) for name in JOINABLE)
