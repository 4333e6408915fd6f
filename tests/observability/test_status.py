"""python -m pycoll.status against real jobs: 8 rank processes over a store this test hosts,
asked from another process (the tool's command line), while the job runs on.

No timed assertions: every wait polls the tool until a generous deadline, and what the tool
took (``took_s``) is reported, not asserted.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rendezvous import StoreServer

pytestmark = pytest.mark.timeout(300)

TOKEN = "status-test-secret"
JOB = str(Path(__file__).with_name("status_job.py"))
N = 8


class Job:
    """``N`` rank processes of status_job.py over a store hosted here."""

    def __init__(self, tmp: Path, n: int = N, script: str = JOB, **env: Any) -> None:
        self.release = tmp / "release"
        self.failed = tmp / "failed"
        self.server = StoreServer("127.0.0.1", 0, token=TOKEN).start()
        self.address = f"127.0.0.1:{self.server.port}"
        base = {**os.environ, "PYCOLL_TOKEN": TOKEN, "PYCOLL_MASTER_ADDR": "127.0.0.1",
                "PYCOLL_MASTER_PORT": str(self.server.port), "PYCOLL_STORE_EXTERNAL": "1",
                "PYCOLL_WORLD_SIZE": str(n), "RELEASE": str(self.release),
                "FAILED": str(self.failed), **{k: str(v) for k, v in env.items()}}
        self.out = [(tmp / f"rank{r}.out", tmp / f"rank{r}.err") for r in range(n)]
        self.procs = []
        for r in range(n):
            with open(self.out[r][0], "w") as out, open(self.out[r][1], "w") as err:
                self.procs.append(subprocess.Popen(
                    [sys.executable, script], start_new_session=True,
                    env={**base, "PYCOLL_RANK": str(r)}, stdout=out, stderr=err))

    def status(self, *args: str, token: str = TOKEN) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pycoll.status", self.address, *args],
                              env={**os.environ, "PYCOLL_TOKEN": token},
                              capture_output=True, text=True, timeout=120)

    def report(self) -> dict[str, Any] | None:
        r = self.status("--json")
        return json.loads(r.stdout) if r.returncode == 0 else None

    def poll(self, pred: Any, deadline: float = 120.0) -> dict[str, Any]:
        """The first report ``pred`` accepts; fails at the deadline with the last one."""
        end = time.monotonic() + deadline
        last = None
        while time.monotonic() < end:
            last = self.report()
            if last is not None and pred(last):
                return last
            time.sleep(0.2)
        raise AssertionError(f"no report matched before the deadline; last: {last}")

    def finish(self, deadline: float = 120.0) -> list[tuple[int, str, str]]:
        self.release.touch()
        out = []
        for p, (stdout, stderr) in zip(self.procs, self.out):
            try:
                p.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            out.append((p.returncode, stdout.read_text(), stderr.read_text()))
        return out

    def close(self) -> None:
        self.release.touch()
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.server.close()


def _all_done(results: list[tuple[int, str, str]]) -> None:
    for rank, (code, out, err) in enumerate(results):
        assert code == 0 and f"rank {rank} done" in out, f"rank {rank}: {code}\n{out}\n{err}"


def test_a_rank_in_user_code_is_named_while_the_job_runs_on(job: Any) -> None:
    j = job(SLEEPER=2)
    report = j.poll(lambda r: r["hung"] is not None)
    hung = report["hung"]
    assert hung["collective"] == "allreduce" and hung["seq"] == 51, hung
    assert hung["waiting_for"] == [2] and hung["waiting"] == [0, 1, 3, 4, 5, 6, 7], hung
    row = report["ranks"][2]
    assert row["state"] == "outside" and row["after"] == {"collective": "allreduce", "seq": 50}
    assert report["ranks"][0]["state"] == "in_collective"
    assert report["ranks"][0]["waiting_for"] == [2]
    for key in ("rank", "host", "pid", "state", "collective", "seq", "waiting_s",
                "waiting_for", "last_completed_seq"):
        assert all(key in r for r in report["ranks"]), key
    text = j.status()
    assert text.returncode == 0, text.stderr
    assert "hung: allreduce #51 on world: ranks 0,1,3,4,5,6,7 wait for rank 2 (outside " \
           "pycoll for" in text.stdout and "since allreduce #50)" in text.stdout, text.stdout
    print(f"status took {report['took_s']} s for {N} ranks")
    _all_done(j.finish())


def test_a_slower_rank_is_named_a_straggler(job: Any) -> None:
    started = time.monotonic()
    j = job(SLOW=5, SLOW_FACTOR=1.2, STEP_S=0.03, STATS=1, PYCOLL_STRAGGLER_LOG=1)
    running: list[float] = []       # when every rank first answered (the loop under way)

    def named(r: dict[str, Any]) -> bool:
        if not running and all(x["state"] in ("in_collective", "outside")
                               for x in r["ranks"]):
            running.append(time.monotonic())
        return any(s["rank"] == 5 for s in r["stragglers"])
    report = j.poll(named)
    # what the "named within 10 s" asks, printed, not asserted (a loaded machine
    # starts 8 interpreters slowly); each ask starts the tool's interpreter, so the time
    # is known to within one ask
    now = time.monotonic()
    print(f"straggler first named {now - started:.1f} s after the job started, "
          f"{now - (running or [now])[0]:.1f} s after every rank first answered")
    named = [s for s in report["stragglers"] if s["rank"] == 5][0]
    assert named["collective"] == "allreduce" and named["late_fraction"] >= 0.5, named
    assert [s["rank"] for s in report["stragglers"]] == [5], report["stragglers"]
    text = j.status()
    assert "straggler: rank 5 arrives last in" in text.stdout, text.stdout
    logged = j.out[0][1]                    # PYCOLL_STRAGGLER_LOG: rank 0's warning
    end = time.monotonic() + 120
    while "straggler: rank 5 arrives last in" not in logged.read_text() \
            and time.monotonic() < end:
        time.sleep(0.2)
    assert "straggler: rank 5 arrives last in" in logged.read_text(), logged.read_text()
    results = j.finish()
    _all_done(results)
    line = next(x for x in results[0][1].splitlines() if x.startswith("STATS "))
    assert [s["rank"] for s in json.loads(line[6:])] == [5], line   # comm.stats() agrees


def test_a_killed_rank_shows_dead(job: Any) -> None:
    j = job()
    report = j.poll(lambda r: all(x["state"] in ("in_collective", "outside")
                                  for x in r["ranks"]))
    pid = report["ranks"][3]["pid"]
    assert pid == j.procs[3].pid
    os.kill(pid, signal.SIGKILL)
    j.procs[3].wait(30)
    report = j.poll(lambda r: r["ranks"][3]["state"] == "dead")
    others = {x["state"] for i, x in enumerate(report["ranks"]) if i != 3}
    assert others <= {"failed", "in_collective", "outside"}, report["ranks"]
    assert "rank 3 dead" in j.status().stdout
    results = j.finish()
    assert all(code == 3 for r, (code, _, _) in enumerate(results) if r != 3), results


def test_a_wrong_or_missing_secret_is_refused(job: Any) -> None:
    j = job()
    j.poll(lambda r: True)
    for token in ("wrong", ""):
        r = j.status(token=token)
        assert r.returncode == 2 and "refused" in r.stderr, (r.returncode, r.stderr)
        assert "outside" not in r.stdout and "in_collective" not in r.stdout
    _all_done(j.finish())


@pytest.mark.parametrize("call", ["holds", "releases"])
def test_a_rank_in_a_long_numpy_call(job: Any, tmp_path: Path, call: str) -> None:
    """Rank 1 sorts at its step 50 in one numpy call of seconds, while the others wait for it
    in allreduce #51. Sorting an object array holds the GIL (every comparison is a Python
    object's), so its status thread cannot answer: the rank shows unreachable, and the tool
    says the GIL may be why. Sorting floats releases the GIL: the rank answers, outside
    pycoll since allreduce #50. Either way the job then finishes correctly. The asking is
    done while the call runs; if the call ended first (a fast machine), there is nothing to
    show and the test skips."""
    mark = tmp_path / "in-numpy"
    done = tmp_path / "in-numpy.done"
    j = job(GIL=1, MARK=mark, GIL_CALL=call, GIL_N=3_000_000 if call == "holds" else 20_000_000)
    end = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert mark.exists()
    time.sleep(1.0)         # the others reach allreduce #51 and wait there
    asks = [subprocess.Popen([sys.executable, "-m", "pycoll.status", j.address, *args,
                              "--timeout", "1"],
                             env={**os.environ, "PYCOLL_TOKEN": TOKEN}, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for args in (["--json"], [])]
    outs = [p.communicate(timeout=120) for p in asks]
    if done.exists():
        _all_done(j.finish(deadline=300))
        pytest.skip("the numpy call returned before the answers: nothing to show")
    assert all(p.returncode == 0 for p in asks), outs
    report, text = json.loads(outs[0][0]), outs[1][0]
    print(text)
    row = report["ranks"][1]
    if call == "holds":
        assert row["state"] == "unreachable" and "GIL" in row["reason"], row
        assert report["hung"] is None or report["hung"]["waiting_for"] == [1], report["hung"]
    else:
        assert row["state"] == "outside", row
        assert row["after"] == {"collective": "allreduce", "seq": 50}, row
        assert report["hung"]["waiting_for"] == [1], report["hung"]
    for other in (0, 2, 3, 4, 5, 6, 7):
        assert report["ranks"][other]["state"] == "in_collective", report["ranks"][other]
        assert report["ranks"][other]["seq"] == 51, report["ranks"][other]
    _all_done(j.finish(deadline=300))


def test_sixteen_ranks_answer(job: Any) -> None:
    """16 rank processes: every one answers; what the survey took is printed (the issue's
    bound, 1 s, is for a machine not shared with other work: not asserted here)."""
    j = job(16, STEP_S=0.05)
    report = j.poll(lambda r: all(x["state"] in ("in_collective", "outside")
                                  for x in r["ranks"]))
    assert [x["rank"] for x in report["ranks"]] == list(range(16))
    took = [report["took_s"]] + [j.poll(lambda r: True)["took_s"] for _ in range(4)]
    print(f"16 ranks: status took {sorted(took)} s")
    _all_done(j.finish(deadline=300))


def test_watch_refreshes(job: Any) -> None:
    j = job()
    j.poll(lambda r: all(x["state"] in ("in_collective", "outside") for x in r["ranks"]))
    watch = subprocess.Popen([sys.executable, "-m", "pycoll.status", j.address, "--json",
                              "--watch", "0.2"], env={**os.environ, "PYCOLL_TOKEN": TOKEN},
                             stdout=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        reports = [json.loads(watch.stdout.readline()) for _ in range(3)]
        assert all(len(r["ranks"]) == N for r in reports)
    finally:
        watch.terminate()
        watch.wait(30)
        if watch.stdout is not None:
            watch.stdout.close()
    _all_done(j.finish())


def _states(comm: Any) -> Any:
    import numpy as np
    x = np.ones(4, dtype=np.float32)
    for _ in range(5):
        comm.allreduce(x)
    group = comm.split(color=comm.rank % 2)
    group.allreduce(x)
    return comm.status()


@pytest.mark.parametrize("recorder", ["500", "0"])
def test_comm_status_reads_the_execution(recorder: str) -> None:
    """``Communicator.status()`` (what the port answers), with and without the flight
    recorder: outside pycoll after 5 allreduces and a split, the group listed too."""
    from pycoll.testing import run_ranks
    for s in run_ranks(_states, 2, env={"PYCOLL_FLIGHT_RECORDER": recorder}):
        world, group = s["communicators"]
        assert world["state"] == "outside" and world["seq"] >= 5, world
        assert group["state"] == "outside" and group["seq"] == 1, group
        if recorder != "0":
            assert world["last_completed_seq"] == world["seq"], world
            assert world["after"]["collective"] in ("allreduce", "allgather"), world
            assert group["last_completed"] == "allreduce", group
        assert s["pid"] > 0 and s["transport"]
