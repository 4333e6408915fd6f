"""Reading ``PYCOLL_*`` environment variables: one place, one kind of error.

A typo in a tuning variable must not surface as a bare ``ValueError`` from deep inside a
transport (or, worse, break ``import pycoll``): every reader here raises
:class:`pycoll.InvalidArgument` naming the variable, the value and what is accepted.
Readers are called when the value is needed (communicator setup, transport open), never at
import time (but ``PYCOLL_FASTPATH_C``: ``runtime/compiled.py`` says why and how a bad value
still cannot break the import).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .errors import InvalidArgument

if TYPE_CHECKING:
    from rendezvous.tls import TlsFiles

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def env_text(name: str) -> str | None:
    """The stripped value of a variable; None when unset or empty."""
    return _raw(name)


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """An integer variable (``1048576``, also ``0x100000``); ``default`` when unset or empty."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        try:
            value = int(raw, 0)   # 0x100000, 1_048_576
        except ValueError:
            raise InvalidArgument(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    """A number; ``default`` when unset or empty."""
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"{name}={raw!r} is not a number") from None
    if value != value or (minimum is not None and value < minimum):
        raise InvalidArgument(f"{name}={raw!r} must be a number >= {minimum}")
    return value


def env_bool(name: str, default: bool) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case); ``default`` when unset."""
    raw = _raw(name)
    if raw is None:
        return default
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise InvalidArgument(f"{name}={raw!r}: use 1 or 0 (true/false, yes/no, on/off)")


def env_choice(name: str, default: str, choices: Sequence[str]) -> str:
    """One of ``choices`` (case-insensitive); ``default`` when unset."""
    raw = _raw(name)
    if raw is None:
        return default
    low = raw.lower()
    if low not in choices:
        raise InvalidArgument(f"{name}={raw!r}: choose one of " + ", ".join(choices))
    return low


def env_list(name: str) -> list[str] | None:
    """A comma-separated list (``shm,tcp``), stripped and lower-cased; None when unset."""
    raw = _raw(name)
    if raw is None:
        return None
    return [item.strip().lower() for item in raw.split(",") if item.strip()]


def env_tls() -> TlsFiles | None:
    """The job's TLS files (``PYCOLL_TLS_CERT``, ``PYCOLL_TLS_KEY``, ``PYCOLL_TLS_CA``): all
    three or none; the store (``rendezvous.tls``) reads the same variables."""
    from rendezvous.tls import TlsConfigError, tls_from_env
    try:
        return tls_from_env()
    except TlsConfigError as e:
        raise InvalidArgument(str(e)) from None


def env_sampling(name: str) -> int:
    """How often to do something optional: ``off`` / ``0`` / unset: 0 (never), ``on`` /
    ``1``: 1 (always), ``sample:N``: N (every N-th time, N >= 1)."""
    raw = _raw(name)
    if raw is None:
        return 0
    low = raw.lower()
    if low in _FALSE:
        return 0
    if low in _TRUE:
        return 1
    if low.startswith("sample:"):
        try:
            every = int(low[len("sample:"):])
        except ValueError:
            every = 0
        if every >= 1:
            return every
    raise InvalidArgument(f"{name}={raw!r}: use off, on or sample:N (N >= 1: every N-th time)")
