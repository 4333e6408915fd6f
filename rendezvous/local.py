"""An in-process store with the TCPStore command set (c10d's HashStore counterpart).

For jobs whose ranks are threads of one process (pycoll's in-process transport, used to test
algorithms and the bootstrap at thousands of ranks): the same calls, semantics and errors as
``TCPStore``, on a dict guarded by one condition variable. Values are stored as bytes.
"""
from __future__ import annotations

import threading
import time
from typing import Iterable, Sequence, Union

from .errors import StoreTimeout

Value = Union[str, bytes, bytearray, int]


def _b(value: Value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


class LocalStore:
    """A thread-safe key-value store living in this process."""

    def __init__(self, timeout: float = 300.0) -> None:
        self.timeout = float(timeout)
        self._data: dict[str, bytes] = {}
        self._cv = threading.Condition()

    def _wait_for(self, keys: Sequence[str], timeout: float | None) -> None:
        limit = self.timeout if timeout is None else float(timeout)
        deadline = time.monotonic() + limit
        with self._cv:
            while True:
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreTimeout(f"keys {missing[:8]} did not appear within {limit:g} s")
                self._cv.wait(remaining)

    def set(self, key: str, value: Value) -> None:
        with self._cv:
            self._data[key] = _b(value)
            self._cv.notify_all()

    def get(self, key: str, *, timeout: float | None = None) -> bytes:
        value = self._data.get(key)     # a dict read is atomic: no lock for present keys
        if value is not None:
            return value
        self._wait_for([key], timeout)
        return self._data[key]

    def add(self, key: str, amount: int = 1) -> int:
        with self._cv:
            value = int(self._data.get(key, b"0")) + int(amount)
            self._data[key] = str(value).encode()
            self._cv.notify_all()
            return value

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        with self._cv:
            current = self._data.get(key)
            exp = _b(expected)
            if (current is None and exp == b"") or current == exp:
                self._data[key] = _b(desired)
                self._cv.notify_all()
                return self._data[key]
            return current if current is not None else exp

    def wait(self, keys: Union[str, Iterable[str]], timeout: float | None = None) -> None:
        self._wait_for([keys] if isinstance(keys, str) else list(keys), timeout)

    def check(self, keys: Union[str, Iterable[str]]) -> bool:
        data = self._data     # dict reads are atomic: thousands of pollers, no lock
        return all(k in data for k in ([keys] if isinstance(keys, str) else list(keys)))

    def delete(self, key: str) -> bool:
        with self._cv:
            return self._data.pop(key, None) is not None

    def num_keys(self) -> int:
        with self._cv:
            return len(self._data)

    def append(self, key: str, value: Value) -> None:
        with self._cv:
            self._data[key] = self._data.get(key, b"") + _b(value)
            self._cv.notify_all()

    def multi_get(self, keys: Iterable[str], *, timeout: float | None = None) -> list[bytes]:
        keys = list(keys)
        self._wait_for(keys, timeout)
        with self._cv:
            return [self._data[k] for k in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        with self._cv:
            for k, v in zip(keys, values):
                self._data[k] = _b(v)
            self._cv.notify_all()

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"LocalStore({len(self._data)} keys)"
