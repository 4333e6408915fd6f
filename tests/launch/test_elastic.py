"""``python -m pycoll.run --elastic``: a lost rank is not the job's end while enough run on.

Real launchers on 127.0.0.1, four real ranks each. Rank 2 SIGKILLs itself; the survivors
wait until the launcher has *reaped* it (its ``/proc`` entry is gone: the launcher has seen
and judged its end), so what the launcher decides never depends on how fast a loaded machine
runs the ranks. The launcher runs under conftest.py's ``run_job``.
"""
from __future__ import annotations

import functools
import json
import re
import signal
import textwrap
from pathlib import Path

import pytest

from pycoll.launch.cli import _parse_args, _UsageError

pytestmark = pytest.mark.timeout(120)

# argv: outdir, then actions. "init": every rank calls pycoll.init() first; "after=S": the
# survivors sleep S seconds once the victim is reaped; "store": they then write and read the
# launcher's store; "exit@R:C": rank R ends with code C; "wait@R:Q": rank R ends only once
# rank Q was reaped. A survivor's last act is its end file, with what it saw.
RANK_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    rank = int(os.environ["PYCOLL_RANK"])
    outdir, actions = sys.argv[1], sys.argv[2:]
    VICTIM = 2

    def path(name, r=rank):
        return os.path.join(outdir, f"{name}.{r}")

    def write(name, text):
        with open(path(name) + ".tmp", "w") as f:
            f.write(text)
        os.rename(path(name) + ".tmp", path(name))

    def reaped(r):
        try:
            pid = int(open(path("pid", r)).read())
        except FileNotFoundError:
            return False
        return not os.path.exists(f"/proc/{pid}")

    def wait_until_reaped(r):
        deadline = time.monotonic() + 60
        while not reaped(r):
            if time.monotonic() > deadline:
                sys.exit(f"rank {rank}: rank {r} was not reaped within 60 s")
            time.sleep(0.02)

    if "init" in actions:
        import pycoll
        pycoll.init(timeout=30)
    write("pid", str(os.getpid()))
    if rank == VICTIM:
        os.kill(os.getpid(), signal.SIGKILL)
    wait_until_reaped(VICTIM)
    record = {"elastic": os.environ.get("PYCOLL_ELASTIC")}
    for a in actions:
        if a.startswith("after="):
            time.sleep(float(a[6:]))
    if "store" in actions:
        import rendezvous
        store = rendezvous.TCPStore(os.environ["PYCOLL_MASTER_ADDR"],
                                    int(os.environ["PYCOLL_MASTER_PORT"]),
                                    token=os.environ["PYCOLL_TOKEN"], timeout=30.0)
        record["added"] = store.add("survivors", 1)
        store.set(f"after/{rank}", str(rank))
        others = [f"after/{r}" for r in range(int(os.environ["PYCOLL_WORLD_SIZE"]))
                  if r != VICTIM]
        store.wait(others, timeout=30.0)
        record["read"] = sorted(store.get(k).decode() for k in others)
        store.close()
    code = 0
    for a in actions:
        if a.startswith("exit@") and int(a[5:].split(":")[0]) == rank:
            code = int(a.split(":")[1])
        if a.startswith("wait@") and int(a[5:].split(":")[0]) == rank:
            wait_until_reaped(int(a.split(":")[1]))
    write("end", json.dumps(record))
    sys.exit(code)
""")


@pytest.fixture
def job(run_job):
    """``job(*launcher_args, *actions)``: the launcher on RANK_SCRIPT."""
    return functools.partial(run_job, RANK_SCRIPT)


def _pid(outdir: Path, rank: int) -> int:
    return int((outdir / f"pid.{rank}").read_text())


def _ends(outdir: Path) -> dict[int, dict]:
    return {int(p.suffix[1:]): json.loads(p.read_text()) for p in outdir.glob("end.*")
            if p.suffix[1:].isdigit()}


# --------------------------------------------------------------------------------------------
# whole jobs


def test_lost_rank_the_others_run_to_completion(job, all_gone):
    rc, err, outdir = job(["-n", 4, "--elastic"], "after=1")
    assert rc == 0, err
    assert (f"pycoll.run: rank 2 (pid {_pid(outdir, 2)}) was killed by signal 9 (SIGKILL); "
            "3 of 4 ranks run on (--elastic, --min-ranks 1)") in err
    assert "pycoll.run: elastic job done: ranks [2] lost, 3 finished with 0" in err
    assert sorted(_ends(outdir)) == [0, 1, 3]       # the survivors really finished
    assert all(rec["elastic"] == "1" for rec in _ends(outdir).values())
    all_gone(outdir)


def test_fewer_than_min_ranks_left_tears_the_job_down(job, all_gone):
    rc, err, outdir = job(["-n", 4, "--elastic", "--min-ranks", 4], "after=30")
    assert rc == 128 + signal.SIGKILL, err
    assert "rank 2" in err and "SIGKILL" in err
    assert ("fewer than 4 ranks are left (3 running, --min-ranks 4): terminating them"
            in err)
    assert "elastic job done" not in err
    assert _ends(outdir) == {}                      # torn down before they finished
    all_gone(outdir)


def test_the_last_survivor_failing_is_the_jobs_exit_code(job, all_gone):
    # ranks 0 and 1 finish with 0; rank 3 ends after them with code 3: nobody outlives it
    rc, err, outdir = job(["-n", 4, "--elastic"], "after=0.2", "exit@3:3", "wait@3:0",
                          "wait@3:1")
    assert rc == 3, err
    assert ("elastic job done: ranks [2] lost, 2 finished with 0, rank 3 exited with code 3"
            in err)
    assert sorted(_ends(outdir)) == [0, 1, 3]
    all_gone(outdir)


def test_a_survivor_failing_while_others_run_on_is_lost_too(job, all_gone):
    # rank 1 exits 3 while ranks 0 and 3 run on: the job outlives it as it outlived rank 2
    rc, err, outdir = job(["-n", 4, "--elastic", "--min-ranks", 2], "after=0.2", "exit@1:3",
                          "wait@0:1", "wait@3:1")
    assert rc == 0, err
    assert (f"rank 1 (pid {_pid(outdir, 1)}) exited with code 3; 2 of 4 ranks run on "
            "(--elastic, --min-ranks 2)") in err
    assert "elastic job done: ranks [2, 1] lost, 2 finished with 0" in err
    all_gone(outdir)


def test_the_store_is_served_after_a_rank_died(job, all_gone):
    # every rank joined through the launcher's store; after rank 2's death the survivors
    # still add, set, wait and get there
    rc, err, outdir = job(["-n", 4, "--elastic"], "init", "after=0.2", "store")
    assert rc == 0, err
    assert "rank 2" in err and "SIGKILL" in err
    ends = _ends(outdir)
    assert sorted(ends) == [0, 1, 3]
    assert sorted(rec["added"] for rec in ends.values()) == [1, 2, 3]
    assert all(rec["read"] == ["0", "1", "3"] for rec in ends.values())
    all_gone(outdir)


# --------------------------------------------------------------------------------------------
# what is refused, before anything starts


def test_parse_elastic_options(monkeypatch):
    p = _parse_args(["-n", "4", "--elastic", "--min-ranks", "3", "train.py", "--elastic"])
    assert (p["elastic"], p["min_ranks"], p["command"]) == (True, 3, ["train.py", "--elastic"])
    p = _parse_args(["-n", "4", "--elastic", "train.py"])
    assert (p["elastic"], p["min_ranks"]) == (True, 1)
    monkeypatch.setenv("PYCOLL_TOKEN", "f" * 32)
    p = _parse_args(["-n", "2", "--elastic", "--min-ranks", "6", "--nnodes", "3", "--node-rank",
                     "1", "--master-addr", "10.0.0.1", "--master-port", "29500", "t.py"])
    assert (p["elastic"], p["min_ranks"], p["nnodes"]) == (True, 6, 3)
    assert _parse_args(["-n", "4", "--min_ranks=4", "--elastic", "t.py"])["min_ranks"] == 4
    assert _parse_args(["-n", "4", "t.py"])["elastic"] is False


@pytest.mark.parametrize("argv, message", [
    (["-n", "4", "--elastic", "--min-ranks", "5", "t.py"], "--min-ranks must be in [1, 4]"),
    (["-n", "2", "--elastic", "--min-ranks", "7", "--nnodes", "3", "--node-rank", "1",
      "--master-addr", "10.0.0.1", "--master-port", "29500", "t.py"],
     "--min-ranks must be in [1, 6] (-n x --nnodes)"),
    (["-n", "4", "--elastic", "--min-ranks", "0", "t.py"], "must be at least 1"),
    (["-n", "4", "--elastic", "--min-ranks", "x", "t.py"], "not an integer"),
    (["-n", "4", "--min-ranks", "2", "t.py"], "--min-ranks applies to elastic jobs only"),
])
def test_parse_elastic_errors(argv, message):
    with pytest.raises(_UsageError, match=re.escape(message)):
        _parse_args(argv)


def test_launch_rejects_bad_elastic_arguments():
    from pycoll.launch import launch

    for kwargs in ({"min_ranks": 0}, {"min_ranks": 3}, {"min_ranks": True}):
        with pytest.raises(ValueError, match="min_ranks must be an integer in"):
            launch(["x.py"], 2, elastic=True, **kwargs)
    with pytest.raises(ValueError, match="applies to elastic jobs only"):
        launch(["x.py"], 2, min_ranks=2)
    with pytest.raises(ValueError, match=re.escape("in [1, 4] (nprocs x nnodes)")):
        launch(["x.py"], 2, elastic=True, min_ranks=5, nnodes=2, token="t", master_port=1)

