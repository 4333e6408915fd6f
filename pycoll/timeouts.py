"""Timeouts as the user gives them: seconds (int or float), ``datetime.timedelta``, or None.

torch.distributed takes ``timedelta``; pycoll and the rendezvous store take seconds. One
converter accepts both so that a timeout can be passed the way the caller's code already
spells it, and rejects what would otherwise fail later or silently mean something else: a
bool (``True`` would be one second), a string, zero, a negative value, NaN.
"""
from __future__ import annotations

import math
import numbers
from datetime import timedelta

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
