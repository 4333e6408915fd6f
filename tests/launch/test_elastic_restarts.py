"""``python -m pycoll.run --elastic --max-restarts K``: a lost rank gets a replacement that
joins the job when the survivors call ``grow``.

Real launchers on 127.0.0.1 (conftest.py's ``run_job``), real ranks with real pycoll
communicators. Rank 1 SIGKILLs itself after a first allreduce; the survivors find it gone,
shrink, and (depending on the test) grow with its replacement. Wherever what the launcher
decides depends on the order in which processes end, the process that must end last first
waits until the other was *reaped* by the launcher (its ``/proc`` entry is gone: the
launcher has seen and judged its end), never for a guessed time.
"""
from __future__ import annotations

import functools
import json
import re
import textwrap
from pathlib import Path

import pytest

from pycoll.launch.cli import _parse_args, _UsageError
from pycoll.launch.launcher import _rank_environment

pytestmark = pytest.mark.timeout(180)

# argv: outdir, mode. Every process writes pid.<name> first (name: its rank, or "r<pid>" for
# a replacement) and, at its end, result.<name> (rank, size and sum of its last allreduce,
# what it saw). Modes, after rank 1's death and the survivors' shrink:
#   grow: the survivors grow(1); the three check an allreduce and finish;
#   grow-then-die: as grow, then the replacement SIGKILLs itself; the survivors shrink again
#       and finish once the launcher reaped it;
#   no-grow: the survivors finish (without grow) once the launcher reaped rank 1.
SCRIPT = textwrap.dedent("""
    import glob, json, os, signal, sys, time
    import numpy as np
    import pycoll

    outdir, mode = sys.argv[1], sys.argv[2]
    replaces = os.environ.get("PYCOLL_REPLACES")
    name = f"r{os.getpid()}" if replaces else os.environ["PYCOLL_RANK"]

    def write(kind, text):
        path = os.path.join(outdir, f"{kind}.{name}")
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.rename(path + ".tmp", path)

    def wait_until_reaped(pid_file):
        deadline = time.monotonic() + 60
        while True:
            paths = glob.glob(os.path.join(outdir, pid_file))
            if paths and not os.path.exists(f"/proc/{int(open(paths[0]).read())}"):
                return
            if time.monotonic() > deadline:
                sys.exit(f"{name}: {pid_file} was not reaped within 60 s")
            time.sleep(0.02)

    def checked_allreduce(comm):
        x = np.full(4, float(comm.rank + 1))
        comm.allreduce(x)
        want = comm.size * (comm.size + 1) / 2
        if not (x == want).all():
            sys.exit(f"{name}: allreduce gave {x}, not {want}")
        return float(x[0])

    def until_error(comm):
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                comm.allreduce(np.ones(4))
        except pycoll.PycollError as e:
            return type(e).__name__
        sys.exit(f"{name}: no error within 30 s of a peer's death")

    write("pid", str(os.getpid()))
    comm = pycoll.init(timeout=60)
    record = {"replaces": replaces, "join": os.environ.get("PYCOLL_JOIN"),
              "env_rank": os.environ["PYCOLL_RANK"], "first": "joined"}
    if not replaces:
        checked_allreduce(comm)
        if comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        record["first"] = until_error(comm)
        comm = pycoll.shrink()
        if mode == "no-grow":
            wait_until_reaped("pid.1")
        else:
            comm = pycoll.grow(1, timeout=60)
    if mode != "no-grow":
        record["grown"] = [comm.rank, comm.size, checked_allreduce(comm)]
    if mode == "grow-then-die":
        if replaces:
            os.kill(os.getpid(), signal.SIGKILL)
        record["second"] = until_error(comm)
        comm = pycoll.shrink()
        wait_until_reaped("pid.r*")
    record["last"] = [comm.rank, comm.size, checked_allreduce(comm)]
    write("result", json.dumps(record))
""")


@pytest.fixture
def job(run_job):
    """``job(*launcher_args, mode)``: the launcher on SCRIPT, three ranks."""
    return functools.partial(run_job, SCRIPT)


def _results(outdir: Path) -> dict[str, dict]:
    return {p.suffix[1:]: json.loads(p.read_text()) for p in outdir.glob("result.*")
            if p.suffix != ".tmp"}


def _pid(outdir: Path, name: str) -> int:
    return int((outdir / f"pid.{name}").read_text())


def _replacements(outdir: Path) -> list[int]:
    return [int(p.read_text()) for p in outdir.glob("pid.r*") if p.suffix != ".tmp"]


STARTED = re.compile(r"pycoll\.run: started a replacement for rank 1 \(pid (\d+), restart 1 of "
                     r"(\d+)\); it joins when the survivors call grow\(\)")


def test_a_replacement_joins_the_grown_world(job, all_gone):
    rc, err, outdir = job(["-n", 3, "--elastic", "--max-restarts", 1], "grow")
    assert rc == 0, err
    assert (f"pycoll.run: rank 1 (pid {_pid(outdir, '1')}) was killed by signal 9 (SIGKILL); "
            "2 of 3 ranks run on and a replacement starts (--elastic, --min-ranks 1, "
            "--max-restarts 1)") in err
    started = STARTED.findall(err)
    assert [(int(pid), int(k)) for pid, k in started] == [(p, 1) for p in _replacements(outdir)]
    assert ("pycoll.run: elastic job done: ranks [1] lost, 1 replacement started "
            "(--max-restarts 1), 3 finished with 0") in err
    results = _results(outdir)
    assert sorted(results) == sorted(["0", "2", f"r{started[0][0]}"])
    # a size-3 world of ranks 0, 1, 2 whose allreduce summed 1 + 2 + 3
    assert sorted(rec["grown"][0] for rec in results.values()) == [0, 1, 2]
    assert all(rec["grown"][1:] == [3, 6.0] for rec in results.values()), results
    replacement = results[f"r{started[0][0]}"]
    assert replacement["grown"][0] == 2                 # the next rank number of the shrunk 2
    assert (replacement["replaces"], replacement["join"], replacement["env_rank"]) == \
        ("1", "1", "1")                                  # the lost rank's variables, kept
    assert "joined" not in (results["0"]["first"], results["2"]["first"])   # they caught it
    assert results["0"]["join"] is None and results["0"]["replaces"] is None
    all_gone(outdir)


def test_restarts_exhausted_the_survivors_finish_after_shrink(job, all_gone):
    rc, err, outdir = job(["-n", 3, "--elastic", "--max-restarts", 1], "grow-then-die")
    assert rc == 0, err
    assert len(STARTED.findall(err)) == 1, err           # no second replacement
    [replacement] = _replacements(outdir)
    assert (f"pycoll.run: rank 1' (pid {replacement}) was killed by signal 9 (SIGKILL); 2 of 3 "
            "ranks run on (--elastic, --min-ranks 1); no restarts left (--max-restarts 1)"
            ) in err
    assert ("pycoll.run: elastic job done: ranks [1, 1'] lost, 1 replacement started "
            "(--max-restarts 1), 2 finished with 0") in err
    results = _results(outdir)
    assert sorted(results) == ["0", "2"]                 # the replacement died before its end
    for rec in results.values():
        assert rec["grown"][1:] == [3, 6.0]              # it had joined: size 3
        assert rec["last"][1:] == [2, 3.0]               # then the survivors shrank to 2
    assert sorted(rec["last"][0] for rec in results.values()) == [0, 1]
    all_gone(outdir)


def test_a_replacement_nobody_admits_is_ended_when_the_others_finish(job, all_gone):
    # the survivors finish without grow(): the replacement must not wait for its deadline
    rc, err, outdir = job(["-n", 3, "--elastic", "--max-restarts", 1], "no-grow")
    assert rc == 0, err
    [replacement] = _replacements(outdir)
    assert (f"pycoll.run: rank 1' (pid {replacement}) still waits to join, and no rank runs "
            "that could admit it (grow()): ending it") in err
    assert ("pycoll.run: elastic job done: ranks [1] lost, 1 replacement started "
            "(--max-restarts 1), 2 finished with 0, rank 1' never admitted") in err
    results = _results(outdir)
    assert sorted(results) == ["0", "2"]
    assert all(rec["last"][1:] == [2, 3.0] for rec in results.values())
    all_gone(outdir)


# --------------------------------------------------------------------------------------------
# without pycoll: what the launcher gives a replacement, and how it counts

# argv: outdir, then "die@N": the N-th process to run as rank 1 (1: the original, 2: its
# first replacement, ...) SIGKILLs itself after the survivors saw it start. Rank 0 ends once
# the last process of rank 1 ended; a process records its environment and ends.
PLAIN_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    outdir, actions = sys.argv[1], sys.argv[2:]
    rank = os.environ["PYCOLL_RANK"]
    mine = os.path.join(outdir, f"run.{rank}")
    with open(mine, "a") as f:
        f.write(f"{os.getpid()}\\n")
    nth = len(open(mine).read().split())
    with open(os.path.join(outdir, f"pid.{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))
    keys = ("PYCOLL_RANK", "PYCOLL_JOIN", "PYCOLL_REPLACES", "PYCOLL_ELASTIC", "RANK")
    print(json.dumps({k: os.environ.get(k) for k in keys}), file=sys.stderr, flush=True)
    if rank == "1" and f"die@{nth}" in actions:
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == "0":
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(outdir, "done")):
            if time.monotonic() > deadline:
                sys.exit("rank 0: rank 1's processes did not finish within 60 s")
            time.sleep(0.02)
    elif rank == "1":
        open(os.path.join(outdir, "done"), "w").close()
""")


def test_a_replacement_is_replaced_again_and_counts_for_min_ranks(run_job, all_gone):
    # --min-ranks 2 of 2: only the replacements keep the job going
    rc, err, outdir = run_job(PLAIN_SCRIPT, ["-n", 2, "--elastic", "--min-ranks", 2,
                                             "--max-restarts", 2, "--prefix-output"],
                              "die@1", "die@2")
    assert rc == 0, err
    pids = (outdir / "run.1").read_text().split()
    assert len(pids) == 3, err
    assert (f"rank 1 (pid {pids[0]}) was killed by signal 9 (SIGKILL); 1 of 2 ranks run on and "
            "a replacement starts (--elastic, --min-ranks 2, --max-restarts 2)") in err
    assert (f"started a replacement for rank 1 (pid {pids[1]}, restart 1 of 2)") in err
    assert f"rank 1' (pid {pids[1]}) was killed by signal 9 (SIGKILL)" in err
    assert (f"started a replacement for rank 1 (pid {pids[2]}, restart 2 of 2)") in err
    assert ("elastic job done: ranks [1, 1'] lost, 2 replacements started (--max-restarts 2), "
            "2 finished with 0") in err
    lines = dict(line.split("] ", 1) for line in err.splitlines() if line.startswith("["))
    assert json.loads(lines["[rank 1''"]) == {"PYCOLL_RANK": "1", "PYCOLL_JOIN": "1",
                                              "PYCOLL_REPLACES": "1", "PYCOLL_ELASTIC": "1",
                                              "RANK": "1"}
    assert json.loads(lines["[rank 0"])["PYCOLL_JOIN"] is None
    all_gone(outdir)


def test_no_restart_left_below_min_ranks_tears_down(run_job, all_gone):
    rc, err, outdir = run_job(PLAIN_SCRIPT, ["-n", 2, "--elastic", "--min-ranks", 2,
                                             "--max-restarts", 1], "die@1", "die@2")
    assert rc == 128 + 9, err
    assert len((outdir / "run.1").read_text().split()) == 2
    assert ("fewer than 2 ranks are left (1 running, 0 restarts left, --min-ranks 2): "
            "terminating them") in err
    all_gone(outdir)


# --------------------------------------------------------------------------------------------
# what is refused, before anything starts


def test_max_restarts_without_elastic_is_refused(run_cli):
    r = run_cli("-n", "2", "--max-restarts", "1", "x.py")
    assert r.returncode == 2, r.stderr
    assert "pycoll.run: error: --max-restarts applies to elastic jobs only: add --elastic" \
        in r.stderr


def test_parse_max_restarts():
    p = _parse_args(["-n", "3", "--elastic", "--max-restarts", "2", "t.py", "--max-restarts"])
    assert (p["max_restarts"], p["command"]) == (2, ["t.py", "--max-restarts"])
    assert _parse_args(["-n", "3", "--elastic", "t.py"])["max_restarts"] == 0
    assert _parse_args(["-n", "3", "--elastic", "--max_restarts=0", "t.py"])["max_restarts"] == 0


@pytest.mark.parametrize("argv, message", [
    (["-n", "2", "--elastic", "--max-restarts", "-1", "t.py"], "must be at least 0"),
    (["-n", "2", "--elastic", "--max-restarts", "x", "t.py"], "not an integer"),
    (["-n", "2", "--max-restarts", "0", "t.py"], "--max-restarts applies to elastic jobs only"),
])
def test_parse_max_restarts_errors(argv, message):
    with pytest.raises(_UsageError, match=re.escape(message)):
        _parse_args(argv)


def test_launch_rejects_bad_max_restarts():
    from pycoll.launch import launch

    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="max_restarts must be an integer >= 0"):
            launch(["x.py"], 2, elastic=True, max_restarts=bad)
    with pytest.raises(ValueError, match="applies to elastic jobs only"):
        launch(["x.py"], 2, max_restarts=1)


def test_an_outer_jobs_join_variables_do_not_reach_the_ranks():
    # a launcher started from inside a replacement must not make its own ranks joiners
    env = _rank_environment({"PYCOLL_JOIN": "1", "PYCOLL_REPLACES": "3", "PYCOLL_ELASTIC": "1",
                             "HOME": "/h"}, rank=0, world=2, local=0, nprocs=2, node_rank=0,
                            host="127.0.0.1", store_port=1, torch_port=2, token="t",
                            elastic=False)
    assert not {"PYCOLL_JOIN", "PYCOLL_REPLACES", "PYCOLL_ELASTIC"} & set(env)
    assert env["HOME"] == "/h"
