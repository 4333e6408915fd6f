"""Flight recorder dumps on failure, and ``python -m pycoll.trace`` explains them."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from pycoll.runtime.calls import CallInfo
from pycoll.runtime.flight_recorder import T_ENDED, FlightRecorder
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(60)


def _hung_rank(comm, hang_rank, hang_for):
    a = np.ones(1000, dtype=np.float32)
    for i in range(5):
        if i == 2 and comm.rank == hang_rank:
            time.sleep(hang_for)          # "stuck" in user code, outside any collective
        comm.allreduce(a)
    return "done"


def _trace(*paths):
    proc = subprocess.run([sys.executable, "-m", "pycoll.trace", *map(str, paths)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_hung_rank_dump_and_trace(tmp_path):
    outcomes = run_ranks(_hung_rank, 4, 2, 4.0, env={"PYCOLL_TRACE_DIR": str(tmp_path)},
                         collective_timeout=1.5, expect_failure=True, timeout=40)
    kinds = [k for k, _ in outcomes]
    for rank in (0, 1, 3):
        assert kinds[rank] in ("CollectiveTimeout", "Aborted"), outcomes[rank]
        assert "allreduce #3" in outcomes[rank][1]
        assert f"Flight recorder: {tmp_path}" in outcomes[rank][1]
    dumps = sorted(tmp_path.glob("pycoll-trace-*-world-rank*.json"))
    assert len(dumps) == 4, dumps     # rank 2 dumps too, once it wakes up and is aborted
    doc = json.loads(dumps[0].read_text())
    for key in ("rank", "world_size", "host", "pid", "communicator", "pycoll_version",
                "dropped", "entries", "reason", "job"):
        assert key in doc, key
    last = doc["entries"][-1]
    assert last["seq"] == 3 and last["collective"] == "allreduce" and last["state"] == "failed"
    assert last["dtype"] == "float32" and last["algorithm"] and last["nbytes"] == 4000
    assert [e["state"] for e in doc["entries"][:2]] == ["completed", "completed"]
    first = doc["entries"][0]
    assert first["started_at"], first
    if first["algorithm"].startswith("fastpath"):   # completion marked, no second clock read
        assert first["ended_at"] is None and first["duration_s"] is None, first

    report = _trace(tmp_path)
    assert "rank 2 was behind: reached allreduce #3 only after ranks 0,1,3" in report, report
    assert "waiting for rank 2 in allreduce #3" in report, report

    # Without rank 2's dump (a rank that hangs for good leaves none), the verdict says so.
    partial = tmp_path / "partial"
    partial.mkdir()
    for d in dumps:
        if not d.name.endswith("rank2.json"):
            (partial / d.name).write_text(d.read_text())
    report = _trace(partial)
    assert "rank 2 left no dump: never started allreduce #3" in report, report
    assert "ranks 0,1,3 are waiting in it" in report, report


def _timeout_without_recorder(comm, marker):
    """Rank 1 stays out of the allreduce until rank 0 has timed out in it (a fixed sleep
    let a loaded host start rank 0's call so late that rank 1 had already left)."""
    a = np.ones(4, dtype=np.float32)
    if comm.rank == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "slept"
    try:
        comm.allreduce(a)
        message = "no timeout"
    except Exception as e:  # noqa: BLE001
        message = str(e)
    open(marker, "w").close()
    return message


def _hung_rank_caught(comm, hang_rank, hang_for):
    try:
        _hung_rank(comm, hang_rank, hang_for)
    except Exception as e:  # noqa: BLE001 - the message is what we check
        return type(e).__name__, str(e)
    return "done", ""


@pytest.mark.parametrize("world,transport", [(4, "shm"), (8, "tcp")])
def test_every_rank_names_the_rank_the_job_waits_for(world, transport):
    """Not only the stuck rank's neighbours: every rank's timeout names it (the ranks that
    time out say whom they wait for through the store; the one nobody hears from is it)."""
    hang = world // 2
    outcomes = run_ranks(_hung_rank_caught, world, hang, 6.0, collective_timeout=1.5,
                         timeout=40, env={"PYCOLL_TRANSPORTS": transport})
    for rank, (kind, message) in enumerate(outcomes):
        if rank == hang:
            continue
        assert kind in ("CollectiveTimeout", "Aborted"), (rank, kind, message)
        # With 8 ranks on 2 cores a rank that timed out may report later than the analysis
        # window (2 s): it is then named beside the stuck rank ("[4, 5]", seen twice in CI);
        # the stuck rank must be named either way.
        whole = re.search(r"the whole job is waiting for rank\(s\) \[([0-9, ]*)\]",
                          message, re.IGNORECASE)
        assert (f"waiting for peer rank(s) [{hang}]" in message
                or (whole is not None and str(hang) in whole.group(1).split(", "))), \
            (rank, message)


def test_recorder_disabled(tmp_path, tmp_path_factory):
    env = {"PYCOLL_TRACE_DIR": str(tmp_path), "PYCOLL_FLIGHT_RECORDER": "0"}
    marker = str(tmp_path_factory.mktemp("marker") / "rank0-timed-out")
    results = run_ranks(_timeout_without_recorder, 2, marker, env=env, collective_timeout=1.0)
    assert "timed out after 1 s" in results[0] and "Flight recorder" not in results[0]
    assert list(tmp_path.iterdir()) == []


def test_ring_keeps_the_last_n_and_counts_dropped(tmp_path):
    fr = FlightRecorder(4)
    for seq in range(1, 11):
        rec = fr.open(seq, CallInfo("allreduce", 8, "float32", 2, algorithm="ring"), 1.0 + seq)
        rec[T_ENDED] = 1.5 + seq
    fr.open(11, CallInfo("broadcast", 16, "int8", 16, root=1), 20.0)
    assert fr.dropped == 7
    snap = fr.snapshot()
    assert [e["seq"] for e in snap] == [8, 9, 10, 11]
    assert [e["state"] for e in snap] == ["completed"] * 3 + ["started"]
    assert snap[0]["dtype"] == "float32" and snap[0]["algorithm"] == "ring"
    assert snap[-1]["root"] == 1 and snap[-1]["count"] == 16
    path = fr.dump(rank=0, world_size=1, communicator="world", reason="test",
                   path=str(tmp_path / "d.json"))
    doc = json.loads(open(path).read())
    assert doc["dropped"] == 7 and doc["recorded"] == 11 and doc["capacity"] == 4
    report = _trace(path)
    assert "older records were dropped" in report
