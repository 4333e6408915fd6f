"""A rank that dies before it ever connected to the others is named at once through its store
lease, not at the collective's deadline (the peers that wait for it to dial them cannot see
a socket close: there was none)."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

import pycoll
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(120)


def _die_before_connecting(comm: pycoll.Communicator, victim: int) -> tuple:
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        comm.allreduce(np.ones(4))
    except pycoll.PeerLost as e:
        return time.monotonic() - start, e.peer
    return None, None


@pytest.mark.parametrize("victim", [0, 3])
def test_a_rank_dead_before_it_dialed_is_named_promptly_over_tcp(victim: int) -> None:
    out = run_ranks(_die_before_connecting, 4, victim, env={"PYCOLL_TRANSPORTS": "tcp"},
                    expect_failure=True, collective_timeout=60)
    assert out[victim][0] == "missing"
    for r, (kind, value) in enumerate(out):
        if r != victim:
            assert kind == "ok" and value[1] == victim, out
            assert value[0] < 15, out          # the deadline is 60 s
