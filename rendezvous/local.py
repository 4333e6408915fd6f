"""An in-process store with the TCPStore command set (c10d's HashStore counterpart).

For jobs whose ranks are threads of one process (pycoll's in-process transport, used to test
algorithms and the bootstrap at thousands of ranks): the same calls, semantics and errors as
``TCPStore``, on the server's own state machine (``kv.KeyValueState``) guarded by one lock.
A blocking call parks like a server-side wait and sleeps on a condition of its own, so a
``set`` wakes only the threads that wait for that key. Values are stored as bytes.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence

from .errors import StoreTimeout
from .kv import KeyValueState, Waiter

Value = str | bytes | bytearray | int


def _b(value: Value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


def _key_list(keys: str | Iterable[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


class _Sleeper(Waiter[str]):
    """A thread parked in ``get``/``wait``/``multi_get``: it sleeps on a condition of the
    store's lock, so a thread woken while a ``set`` still holds the lock queues for the lock
    (off the GIL) instead of taking turns with the setter (a convoy of thousands of threads,
    one of which is the setter)."""

    __slots__ = ("woken",)

    def __init__(self, keys: list[str], lock: threading.Lock) -> None:
        super().__init__(keys)
        self.woken = threading.Condition(lock)


def _wake(waiter: Waiter[str]) -> None:
    assert isinstance(waiter, _Sleeper)
    waiter.woken.notify()


class LocalStore:
    """A thread-safe key-value store living in this process."""

    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout = float(timeout)
        self._kv: KeyValueState[str] = KeyValueState(_wake)
        self._lock = threading.Lock()

    def _wait_for(self, keys: list[str], timeout: float | None) -> None:
        limit = self.timeout if timeout is None else float(timeout)
        with self._lock:
            sleeper = _Sleeper(keys, self._lock)
            if not self._kv.park(sleeper):
                return
            sleeper.woken.wait(None if math.isinf(limit) else max(limit, 0.0))
            if not sleeper.active:          # woken (perhaps just as the deadline passed)
                return
            self._kv.cancel(sleeper)
            missing = self._kv.missing(keys)
        raise StoreTimeout(f"keys {missing[:8]} did not appear within {limit:g} s")

    def set(self, key: str, value: Value) -> None:
        with self._lock:
            self._kv.set(key, _b(value))

    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        value = self._kv.data.get(key)  # a dict read is atomic: no lock for present keys
        if value is not None:
            return value
        self._wait_for([key], timeout)
        return self._kv.data[key]

    def add(self, key: str, amount: int = 1) -> int:
        with self._lock:
            return self._kv.add(key, int(amount))   # kv.NotAnInteger, a ValueError

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        with self._lock:
            return self._kv.compare_set(key, _b(expected), _b(desired))

    def wait(self, keys: str | Iterable[str], timeout: float | None = None) -> None:
        self._wait_for(_key_list(keys), timeout)

    def check(self, keys: str | Iterable[str]) -> bool:
        return self._kv.has_all(_key_list(keys))  # dict reads: thousands of pollers, no lock

    def delete(self, key: str) -> bool:
        with self._lock:
            return self._kv.delete(key)

    def num_keys(self) -> int:
        with self._lock:
            return len(self._kv.data)

    def append(self, key: str, value: Value) -> None:
        with self._lock:
            self._kv.append(key, _b(value))

    def multi_get(self, keys: Iterable[str], *, timeout: float | None = None) -> list[bytes]:
        keys = list(keys)
        self._wait_for(keys, timeout)
        with self._lock:
            return self._kv.values(keys)

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        with self._lock:
            self._kv.multi_set(keys, [_b(v) for v in values])

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"LocalStore({len(self._kv.data)} keys)"
