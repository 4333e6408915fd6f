"""kill -9 a rank in the middle of allreduce / broadcast: every survivor names it, quickly.

Survivors that talked to the dead rank raise PeerLost naming it (tcp: connection reset; shm:
the pidfd of the peer becomes readable); the others learn through the abort record and raise
Aborted, whose message also names the dead rank. Only a generous bound is asserted (15 s
against a 60 s deadline; benchmarks/fault_detection.py measures the real latency). Every process is
reaped and no /dev/shm segment of the job's ranks is left behind.
"""
from __future__ import annotations

import pytest

from pycoll.testing.faults import kill_during

SMALL, LARGE = 8, 8 << 20

# Every combination (world 8 on 2 cores takes about a second a case).
CASES = [(w, t, c, n) for w in (2, 4, 8) for t in ("shm", "tcp")
         for c in ("allreduce", "broadcast") for n in (SMALL, LARGE)]


def _victim(world: int, nbytes: int) -> int:
    if world == 2:
        return 1 if nbytes == SMALL else 0       # rank 0 is the broadcast root too
    return world // 2 + (1 if nbytes == LARGE else 0)   # away from rank 0 in ring and tree


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world,transport,collective,nbytes", CASES,
                         ids=[f"w{w}-{t}-{c}-{'large' if n == LARGE else 'small'}"
                              for w, t, c, n in CASES])
def test_killed_rank_is_named_by_every_survivor(world, transport, collective, nbytes, tmp_path):
    victim = _victim(world, nbytes)
    result = kill_during(world, collective, nbytes, victim=victim, transport=transport,
                         env={"PYCOLL_TRACE_DIR": str(tmp_path)}, deadline=60.0, wait=20.0)
    assert len(result.survivors) == world - 1
    assert result.misblamed(within=15.0) == []
    assert all("Flight recorder:" in s.message for s in result.survivors)
    assert result.leaked_segments == []
    assert result.still_running() == []
    assert list(tmp_path.glob("pycoll-trace-*-rank*.json")), "survivors dump their recorders"
