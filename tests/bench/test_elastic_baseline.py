"""Smoke test of benchmarks/elastic_restart_baseline.py: one real torchrun job (2 ranks, Gloo)
whose last rank gets SIGKILL; the restarted job must train again from rank 0's checkpoint and
the script must report a positive recovery time, leaving no process and no temporary file.

The timeline arithmetic is also checked in-process on hand-written event lines.
"""
from __future__ import annotations

import json
import os

import pytest

from .helpers import PY, ROOT, benchmark_module, clean_env, run

pytest.importorskip("torch.distributed.run",
                    reason="torch's launcher (torch.distributed.run) is not installed")


@pytest.mark.timeout(400)
def test_one_trial_recovers_from_the_checkpoint(tmp_path):
    scratch, out = tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir()
    res = run([PY, os.path.join(ROOT, "benchmarks", "elastic_restart_baseline.py"),
               "--nproc", "2", "--trials", "1", "--kill-after", "7", "--ckpt-every", "3",
               "--steps-after", "40", "--trial-timeout", "300", "--out", str(out)],
              timeout=360, env=clean_env(TMPDIR=str(scratch)))
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads((out / "torchrun-gloo-restart.json").read_text())
    assert not result["failures"] and len(result["trials"]) == 1
    t = result["trials"][0]
    assert t["victim"] == 1 and t["kill_step"] >= 7
    # rank 0 checkpointed every 3 steps; the new group resumed from the last one before the kill
    assert t["resumed_from"] % 3 == 0 and 3 <= t["resumed_from"] <= t["kill_step"]
    assert 0 < t["respawn_s"] < t["first_step_any_s"] <= t["first_step_all_s"]
    assert t["startup_s"] > 0
    assert t["respawn_s"] + t["startup_s"] <= t["first_step_all_s"] <= t["progress_s"]
    last = t["last_rank_s"]
    assert last["start"] < last["imports"] < last["init_process_group"] < last["ddp"] \
        < last["step"]
    assert result["summary"]["first_step_any_s"]["p50"] == t["first_step_any_s"]
    md = (out / "torchrun-gloo-restart.md").read_text()
    assert "Restarts that trained again: 1 of 1." in md and result["command"] in md
    # the trial's folder (torchrun's own temporary files were put in it) is gone, and so is
    # every process whose command line named it
    assert os.listdir(scratch) == []
    assert benchmark_module("elastic_restart_baseline").pids_naming(str(scratch)) == []


def test_timeline_from_event_lines():
    bench = benchmark_module("elastic_restart_baseline")
    kill = 100.0
    events = []
    for rank in (0, 1):
        events += [(90.0, "start", 0, rank, 0), (91.0, "ddp", 0, rank, 0)]
        events += [(92.0 + s / 10, "step", s, rank, 0) for s in range(1, 9)]
    events += [(99.9, "step", 9, 0, 0)]   # rank 0 was one step ahead at the kill
    for rank, skew in ((0, 0.0), (1, 0.5)):
        events += [(101.0 + skew, "start", 0, rank, 1), (103.0 + skew, "imports", 0, rank, 1),
                   (104.0 + skew, "init_process_group", 0, rank, 1),
                   (105.0 + skew, "model", 0, rank, 1), (105.5 + skew, "checkpoint", 6, rank, 1),
                   (106.0 + skew, "ddp", 0, rank, 1)]
        events += [(107.0 + skew + (s - 7) / 10, "step", s, rank, 1) for s in range(7, 12)]
    t = bench.timeline(events, kill, victim=1, nproc=2)
    assert t["kill_step"] == 9 and t["resumed_from"] == 6
    assert t["respawn_s"] == pytest.approx(1.0)
    assert t["startup_s"] == pytest.approx(106.5 - 101.0)
    assert t["first_step_any_s"] == pytest.approx(7.0)
    assert t["first_step_all_s"] == pytest.approx(7.5)
    assert t["progress_s"] == pytest.approx(107.5 + 0.3 - kill)   # step 10 on rank 1
    assert t["initial_startup_s"] == pytest.approx(1.0)
    assert t["step_ms"] == pytest.approx(100.0)
    s = bench.summarise([t, t])
    assert s["rank_start_to_imports_s"]["p50"] == pytest.approx(2.0)
    assert s["last_rank_step_s"]["max"] == pytest.approx(7.5)
    # the checkpoint the restart resumed from proves its step was done before the kill,
    # even when that step's log line is stamped after it (a loaded machine)
    late = [e for e in events if not (e[1] == "step" and e[2] == 9 and e[4] == 0)]
    late = [(e[0], e[1], 9 if e[1] == "checkpoint" else e[2], e[3], e[4]) for e in late]
    late += [(100.2, "step", 9, 0, 0)]
    t = bench.timeline(late, kill, victim=1, nproc=2)
    assert t["kill_step"] == 9 and t["resumed_from"] == 9
    assert t["progress_s"] == pytest.approx(107.5 + 0.3 - kill)   # step 10 on rank 1
    # a rank that never logged after the restart is an error, not a number
    with pytest.raises(bench.TrialError, match="incomplete"):
        bench.timeline([e for e in events if not (e[3] == 1 and e[4] == 1)], kill, 1, 2)


def test_exit_note_names_the_root_cause(tmp_path):
    """A job that trained to the end after the restart but whose worker aborted at exit: the
    note names torchrun's root-cause rank, its signal and the C++ runtime's last words."""
    bench = benchmark_module("elastic_restart_baseline")
    log = tmp_path / "torchrun.out"
    log.write_text("E1125 api.py:1002] failed (exitcode: -9) local_rank: 3 (pid: 18922)\n"
                   "terminate called without an active exception\n"
                   "Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n"
                   "  exitcode  : -15 (pid: 19025)  (SIGTERM)\n"
                   "Root Cause (first observed failure):\n[0]:\n"
                   "  rank      : 2 (local_rank: 2)\n"
                   "  exitcode  : -6 (pid: 19024)  (SIGABRT)\n")
    note = bench.exit_note(1, str(log))
    assert note == ("torchrun exited with 1 after every rank's last step; rank 2 exit code -6 "
                    "(SIGABRT); 'terminate called without an active exception'")
