"""Timeouts as the user gives them: seconds (int or float), ``datetime.timedelta``, or None.

torch.distributed takes ``timedelta``; pycoll and the rendezvous store take seconds. One
converter accepts both so that a timeout can be passed the way the caller's code already
spells it, and rejects what would otherwise fail later or silently mean something else: a
bool (``True`` would be one second), a string, zero, a negative value, NaN.
"""
from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from .errors import InvalidArgument


def as_seconds(timeout: float | timedelta | None, what: str = "timeout") -> float | None:
    """``timeout`` in seconds as a float, or None for None ("no timeout given").

    Accepts a real number > 0 (int, float, numpy scalars; ``math.inf`` means no limit) and a
    ``timedelta`` > 0.
    Anything else raises :class:`pycoll.InvalidArgument` naming ``what``, e.g.
    ``as_seconds(-1, "collective_timeout")``.
    """
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        try:
            seconds = float(timeout)
        except OverflowError:        # an int too large for a float: no limit in practice
            seconds = math.inf
    else:
        raise InvalidArgument(f"{what} must be a number of seconds or a datetime.timedelta, "
                              f"not {type(timeout).__name__} {timeout!r}")
    if math.isnan(seconds) or seconds <= 0:
        raise InvalidArgument(f"{what} must be > 0 seconds, got {timeout!r}")
    return seconds


#: how long one slice of a watched store wait lasts (``watched_multi_get``)
WATCH_SLICE = 0.05


def watched_multi_get(store: Any, keys: Sequence[str], timeout: float,
                      watch: Callable[[], None] | None) -> list[bytes]:
    """``store.multi_get(keys, timeout=timeout)``, in slices of ``WATCH_SLICE`` seconds with
    ``watch()`` between them when it is given: it raises when the wait is hopeless (a rank
    that would set a key is gone), so a wait on a dead rank ends at once, not at
    ``timeout``. The last slice's ``StoreTimeout`` is raised as the store raised it."""
    if watch is None:
        return store.multi_get(keys, timeout=timeout)
    from rendezvous import StoreTimeout

    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            return store.multi_get(keys, timeout=max(0.001, min(WATCH_SLICE, remaining)))
        except StoreTimeout:
            if remaining <= WATCH_SLICE:
                raise
        watch()
