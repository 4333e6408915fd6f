"""An adapter that lets pycoll bootstrap over torch's c10d store.

``Communicator.create`` speaks the rendezvous store protocol: ``set(key, value)``,
``get(key, timeout=)``, ``multi_get(keys, timeout=)`` (blocking until every key exists),
``add(key, amount)``, ``wait(keys, timeout=)`` and friends, with timeouts in seconds. torch's
``Store`` has the same commands with other signatures: timeouts are ``timedelta`` values or
the store's own ``set_timeout`` (which is shared with torch, so we never change it), and
``multi_get`` does not take a timeout. Per-call timeouts therefore go through ``wait(keys,
timedelta)`` first, which is exactly a bounded "block until these keys exist".
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from ..errors import CollectiveTimeout, PycollError

Value = str | bytes


def _as_bytes(value: Value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _keys(keys: str | Iterable[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


class StoreClosed(PycollError):
    """The adapter was closed (the process group shut down)."""


class TorchStoreAdapter:
    """pycoll's store protocol over a ``torch.distributed.Store`` (TCPStore, PrefixStore...)."""

    def __init__(self, store: Any, timeout: float) -> None:
        self._store = store
        self.timeout = float(timeout)
        self.closed = False

    @property
    def store(self) -> Any:
        """The torch store; refused once closed, so that teardown never talks to a torch
        store whose server (rank 0's process) may already be gone: torch would print a C++
        stack trace for that even though the error is handled."""
        if self.closed:
            raise StoreClosed("the process group was shut down; its store is no longer used")
        return self._store

    def _wait(self, keys: list[str], timeout: float | None) -> None:
        limit = self.timeout if timeout is None else float(timeout)
        try:
            self.store.wait(keys, timedelta(seconds=max(limit, 0.001)))
        except RuntimeError as e:   # torch raises DistStoreError (a RuntimeError) on timeout
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                raise CollectiveTimeout(f"pycoll bootstrap over torch's store: keys {keys[:4]}"
                                        f"{'...' if len(keys) > 4 else ''} did not appear "
                                        f"within {limit:g} s ({e}); did every rank of the "
                                        "group create it?") from None
            raise

    def set(self, key: str, value: Value) -> None:
        self.store.set(key, _as_bytes(value))

    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        self._wait([key], timeout)
        return bytes(self.store.get(key))

    def multi_get(self, keys: Iterable[str], *, timeout: float | None = None) -> list[bytes]:
        keys = _keys(keys)
        if not keys:
            return []
        self._wait(keys, timeout)
        return [bytes(v) for v in self.store.multi_get(keys)]

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        self.store.multi_set(list(keys), [_as_bytes(v) for v in values])

    def add(self, key: str, amount: int = 1) -> int:
        return int(self.store.add(key, int(amount)))

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return bytes(self.store.compare_set(key, _as_bytes(expected), _as_bytes(desired)))

    def wait(self, keys: str | Iterable[str], timeout: float | None = None) -> None:
        self._wait(_keys(keys), timeout)

    def check(self, keys: str | Iterable[str]) -> bool:
        return bool(self.store.check(_keys(keys)))

    def delete(self, key: str) -> bool:
        return bool(self.store.delete_key(key))

    delete_key = delete

    def num_keys(self) -> int:
        return int(self.store.num_keys())

    def append(self, key: str, value: Value) -> None:
        self.store.append(key, _as_bytes(value))

    def close(self) -> None:
        """Stop using the store (torch owns it and closes it)."""
        self.closed = True

    def __repr__(self) -> str:
        return f"TorchStoreAdapter({self._store!r})"
