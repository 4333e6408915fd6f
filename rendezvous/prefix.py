"""Namespaced view of a store, so several groups and jobs can share one server."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .client import Timeout, Value
from .store import Store

__all__ = ["PrefixStore"]


class PrefixStore:
    """The store API with every key transparently prefixed by ``prefix + "/"`` (as in c10d).

    Nested prefix stores compose (``PrefixStore("b", PrefixStore("a", s))`` uses ``"a/b/key"``).
    ``num_keys()`` counts the keys of the *whole underlying store*, like c10d's PrefixStore,
    because the server keeps one flat key space; count your own keys with ``add`` if needed.
    ``close()`` does not close the underlying store, which other views may still use.
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise TypeError("prefix must be a str")
        self.prefix = prefix
        # Any: every call passes through, so the underlying store's own signatures apply (a
        # TCPStore takes timedelta timeouts, and wait/num_keys/append/multi_set, which pycoll
        # never calls and the Store protocol therefore leaves out).
        self.underlying_store: Any = store
        self._p = prefix + "/"

    def _k(self, key: str) -> str:
        if not isinstance(key, str):
            raise TypeError(f"store keys must be str, got {type(key).__name__}")
        return self._p + key

    def _ks(self, keys: str | Iterable[str]) -> list[str]:
        if isinstance(keys, str):
            keys = [keys]
        return [self._k(k) for k in keys]

    @property
    def timeout(self) -> float:
        return self.underlying_store.timeout

    def set(self, key: str, value: Value) -> None:
        self.underlying_store.set(self._k(key), value)

    def get(self, key: str, *, timeout: Timeout = None) -> bytes:
        return self.underlying_store.get(self._k(key), timeout=timeout)

    def add(self, key: str, amount: int = 1) -> int:
        return self.underlying_store.add(self._k(key), amount)

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self.underlying_store.compare_set(self._k(key), expected, desired)

    def wait(self, keys: str | Iterable[str], timeout: Timeout = None) -> None:
        self.underlying_store.wait(self._ks(keys), timeout=timeout)

    def check(self, keys: str | Iterable[str]) -> bool:
        return self.underlying_store.check(self._ks(keys))

    def delete(self, key: str) -> bool:
        return self.underlying_store.delete(self._k(key))

    delete_key = delete

    def num_keys(self) -> int:
        """Keys in the whole underlying store (c10d semantics), not just this namespace."""
        return self.underlying_store.num_keys()

    def append(self, key: str, value: Value) -> None:
        self.underlying_store.append(self._k(key), value)

    def lease(self, key: str, value: Value, on_close: Value, *,
              keepalive_ms: int = 0) -> None:
        """``TCPStore.lease`` under the prefix (AttributeError where the store has none)."""
        self.underlying_store.lease(self._k(key), value, on_close, keepalive_ms=keepalive_ms)

    def multi_get(self, keys: Iterable[str], *, timeout: Timeout = None) -> list[bytes]:
        return self.underlying_store.multi_get(self._ks(keys), timeout=timeout)

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        self.underlying_store.multi_set(self._ks(keys), values)

    def close(self) -> None:
        """No-op: the underlying store is shared and closed by its owner."""

    def __enter__(self) -> PrefixStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PrefixStore({self.prefix!r}, {self.underlying_store!r})"
