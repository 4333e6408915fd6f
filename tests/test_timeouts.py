"""pycoll.timeouts.as_seconds: seconds, timedelta or None; everything else rejected by name."""
from __future__ import annotations

import math
from datetime import timedelta
from fractions import Fraction

import numpy as np
import pytest

import pycoll
from pycoll.timeouts import as_seconds


@pytest.mark.parametrize("value,expected", [
    (None, None),
    (1, 1.0),
    (0.25, 0.25),
    (30, 30.0),
    (math.inf, math.inf),
    (10 ** 400, math.inf),
    (np.float32(1.5), 1.5),
    (np.int64(3), 3.0),
    (Fraction(1, 4), 0.25),
    (timedelta(seconds=90), 90.0),
    (timedelta(milliseconds=5), 0.005),
    (timedelta(minutes=30), 1800.0),
])
def test_accepted(value, expected):
    got = as_seconds(value)
    assert got == expected
    assert got is None or type(got) is float


@pytest.mark.parametrize("value", [
    0, 0.0, -1, -0.5, math.nan, -math.inf,
    timedelta(0), timedelta(seconds=-1),
    True, False, np.bool_(True),
    "30", "1s", b"30", [30], object(), 1j,
])
def test_rejected_naming_what(value):
    with pytest.raises(pycoll.InvalidArgument) as e:
        as_seconds(value, "collective_timeout")
    assert "collective_timeout" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_default_name_is_timeout():
    with pytest.raises(pycoll.InvalidArgument, match=r"^timeout must be > 0"):
        as_seconds(-3)
    with pytest.raises(pycoll.InvalidArgument, match=r"^timeout must be a number of seconds"):
        as_seconds("3")


def _with_timedeltas(comm):
    import numpy as np

    a = np.ones(4, dtype=np.float32)
    comm.allreduce(a, timeout=timedelta(seconds=20))
    sub = comm.split(0, timeout=timedelta(seconds=20))
    b = np.ones(2, dtype=np.int64)
    sub.broadcast(b, root=0, timeout=timedelta(milliseconds=20_000))
    refused = None
    try:
        comm.allreduce(a, timeout=timedelta(seconds=-1))
    except pycoll.InvalidArgument as e:
        refused = str(e)
    comm.barrier()            # the refused call took no sequence number: ranks stay in step
    return float(a[0]), int(b[0]), refused


def test_collectives_accept_timedelta():
    from pycoll.testing import run_ranks

    for total, value, refused in run_ranks(_with_timedeltas, 2):
        assert (total, value) == (2.0, 1)
        assert refused is not None and "timeout" in refused
