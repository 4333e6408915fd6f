"""The store's key-value state machine: its data, the semantics of every command, and waits.

One implementation serves both stores: the TCP server (``server.py``), which drives it from
its event loop and answers a connection when its wait completes, and ``LocalStore``, which
drives it under a lock and wakes a thread. Neither the wire nor threads appear here, so the
two stores cannot drift apart (``compare_set`` on a missing key, ``add`` on a non-number).

Why waits park on one key: a wait for N keys parks on the first missing key only and, when
that key is set, scans forward for the next missing one, so a waiter is woken at most once per
key it actually waits for and the bootstrap pattern (everyone sets one key, then waits for all
of them) stays O(N) per waiter instead of O(N) wake-ups per set.

Keys are ``bytes`` in the server and ``str`` in ``LocalStore``; values are always ``bytes``.
The caller serializes every call (the server's loop is one thread; ``LocalStore`` holds a
lock); reading ``data`` for a present key needs no lock in CPython.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

__all__ = ["KeyValueState", "NotAnInteger", "Waiter"]

K = TypeVar("K", str, bytes)

#: how many keys ``first_missing`` checks per step (see there)
_SCAN_CHUNK = 32


class NotAnInteger(ValueError):
    """``add`` on a key whose value is not a decimal integer."""


class Waiter(Generic[K]):
    """A parked wait for ``keys``; ``pos`` indexes the key it is currently parked on.

    ``active`` turns False when the wait completes or is cancelled, never back. Stores
    subclass it to carry what completing the wait needs (a connection, a condition).
    """

    __slots__ = ("keys", "pos", "active")

    def __init__(self, keys: Sequence[K]) -> None:
        self.keys: Sequence[K] = keys
        self.pos = 0
        self.active = True


class KeyValueState(Generic[K]):
    """The data of one store and the commands on it.

    ``ready`` is called with each waiter whose keys all exist, inside the call that set the
    last of them (so it sees the values that completed the wait); the waiter is already
    inactive and out of ``watchers``.
    """

    def __init__(self, ready: Callable[[Waiter[K]], None]) -> None:
        self.data: dict[K, bytes] = {}
        #: missing key -> the waiters parked on it
        self.watchers: dict[K, set[Waiter[K]]] = {}
        self._ready: Callable[[Waiter[K]], None] = ready

    # ------------------------------------------------------------------ commands

    def set(self, key: K, value: bytes) -> None:
        """Store ``value`` under ``key`` and wake the waiters parked on it."""
        self.data[key] = value
        if key in self.watchers:
            self._notify(key)

    def multi_set(self, keys: Iterable[K], values: Iterable[bytes]) -> None:
        for key, value in zip(keys, values):
            self.set(key, value)

    def compare_set(self, key: K, expected: bytes, desired: bytes) -> bytes:
        """c10d semantics: a missing key is created only when ``expected`` is empty. Returns
        the value now stored (``desired`` on success), or ``expected`` for a missing key."""
        current = self.data.get(key)
        if current is None:
            if expected == b"":
                self.set(key, desired)
                return desired
            return expected
        if current == expected:
            self.set(key, desired)
            return desired
        return current

    def add(self, key: K, amount: int) -> int:
        """Add ``amount`` to the decimal integer at ``key`` (created at 0); return the sum."""
        try:
            value = int(self.data.get(key, b"0")) + amount
        except ValueError:
            raise NotAnInteger(f"add: the value of key {key[:100]!r} is not an integer") from None
        self.set(key, str(value).encode())
        return value

    def appended(self, key: K, value: bytes) -> bytes:
        """What ``append(key, value)`` would store (the server checks its size first)."""
        return self.data.get(key, b"") + value

    def append(self, key: K, value: bytes) -> None:
        """Append ``value`` to the bytes at ``key`` (created empty)."""
        self.set(key, self.appended(key, value))

    def delete(self, key: K) -> bool:
        """Delete ``key``; whether it existed. Waits that already passed it verify again
        before they complete (``_notify``)."""
        return self.data.pop(key, None) is not None

    def has_all(self, keys: Iterable[K]) -> bool:
        return all(map(self.data.__contains__, keys))     # the loop runs in C

    def values(self, keys: Iterable[K]) -> list[bytes]:
        data = self.data
        return [data[k] for k in keys]

    def missing(self, keys: Iterable[K]) -> list[K]:
        data = self.data
        return [k for k in keys if k not in data]

    # ------------------------------------------------------------------ waits

    def park(self, waiter: Waiter[K]) -> bool:
        """Park ``waiter`` on its first missing key; False (not parked) if none is missing."""
        pos = self.first_missing(waiter.keys, 0)
        if pos == len(waiter.keys):
            return False
        waiter.pos = pos
        self.watchers.setdefault(waiter.keys[pos], set()).add(waiter)
        return True

    def cancel(self, waiter: Waiter[K]) -> None:
        """Unpark ``waiter`` (its deadline passed, or its client went away)."""
        waiter.active = False
        if waiter.pos < len(waiter.keys):
            key = waiter.keys[waiter.pos]
            parked = self.watchers.get(key)
            if parked is not None:
                parked.discard(waiter)
                if not parked:
                    del self.watchers[key]

    def first_missing(self, keys: Sequence[K], start: int) -> int:
        """Index of the first key at or after ``start`` not in the store (``len(keys)`` if
        none)."""
        contains = self.data.__contains__
        n = len(keys)
        # Chunks keep the per-key work in C without over-scanning far past the first miss
        # (a waiter is re-scanned from its position every time its key arrives).
        for i in range(start, n, _SCAN_CHUNK):
            present = list(map(contains, keys[i:i + _SCAN_CHUNK]))
            try:
                return i + present.index(False)
            except ValueError:
                continue
        return n

    def _notify(self, key: K) -> None:
        waiters = self.watchers.pop(key, None)
        if not waiters:
            return
        for w in waiters:
            if not w.active:
                continue
            pos = self.first_missing(w.keys, w.pos)
            if pos == len(w.keys):
                # Keys before ``pos`` were present when passed but could have been deleted
                # since; verify once before answering.
                pos = self.first_missing(w.keys, 0)
            if pos < len(w.keys):
                w.pos = pos
                self.watchers.setdefault(w.keys[pos], set()).add(w)
                continue
            w.active = False
            self._ready(w)
