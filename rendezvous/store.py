"""``Store``: what pycoll needs from a key-value store, as a ``typing.Protocol``.

pycoll bootstraps over any store with these calls: its own ``TCPStore`` and ``LocalStore``, a
``PrefixStore`` view of either, or torch's c10d store through
``pycoll.launch.torch_store.TorchStoreAdapter``. The protocol lists exactly the methods pycoll
calls, with the signatures it calls them with; a store may have more (``wait``, ``num_keys``,
``append``, ``multi_set``: all four above do). Attributes some callers look for first
(``set_timeout``, ``timeout``, ``host``/``port``, ``server``, ``underlying_store``) stay
duck-typed: they are optional.

Values are ``str`` (UTF-8 encoded) or ``bytes``; values come back as ``bytes``. ``timeout``
is seconds, ``None`` for the store's default. ``runtime_checkable``: ``isinstance(x, Store)``
checks that the methods exist (not their signatures; mypy checks those).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

__all__ = ["Store"]


@runtime_checkable
class Store(Protocol):
    """A key-value store a pycoll job bootstraps over (docs/rendezvous.md, "The Store
    protocol")."""

    def set(self, key: str, value: str | bytes) -> None:
        """Store ``value`` under ``key``, waking whoever waits for it."""

    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        """The value of ``key``, waiting until it exists or ``timeout`` passes."""

    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (created at 0); the sum."""

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        """c10d ``compareSet``: the value stored afterwards (``desired`` on success)."""

    def multi_get(self, keys: Iterable[str], *, timeout: float | None = None) -> list[bytes]:
        """The values of ``keys`` in order, waiting until every one exists."""

    def check(self, keys: Iterable[str]) -> bool:
        """Whether every key exists now (never waits)."""

    def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""

    def close(self) -> None:
        """Release the store's connection (a view's owner closes what it shares)."""
