"""Kill-and-recover trials of the elastic calls (``benchmarks/elastic_trials.py``, tests).

One trial: ``n`` ranks run a loop of mixed collectives (allreduce, broadcast, allgather,
reduce_scatter, alltoall, a send/recv ring, agree), every result checked; a victim rank
SIGKILLs itself at a random moment ("loop"), or inside an agree ("agree"); every survivor
catches the error, shrinks, and runs checked collectives and a closing agree on the shrunk
communicator. "shrink": a second victim dies while the survivors shrink. "grow": the
survivors then grow by a joiner that waited since the start; "growkill": and a second victim
dies during that grow. A trial passes when every survivor ends on a communicator of the same
size, renumbered 0..m-1, whose collectives gave the right results; a wrong result anywhere
fails it (``WrongResult``), a hang is cut by the run's timeout.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

#: element counts the loop cycles through: the fast path's sizes and the generic path's
COUNTS = (1, 1024, 65536)
#: checked collectives each survivor runs on the shrunk communicator
AFTER_STEPS = 3
#: recoveries a survivor attempts (a second victim may die right after a shrink)
MAX_RECOVERIES = 4


class WrongResult(AssertionError):
    """A collective returned without error but with a wrong result (never acceptable)."""


@dataclass
class Plan:
    """Who dies when: ``victim`` kills itself ``delay`` seconds into the loop ("loop",
    "shrink") or ``second_delay`` into the first agree after that ("agree"); ``second``
    ("shrink") dies ``second_delay`` into the survivors' shrink."""
    victim: int
    delay: float
    second: int | None = None
    mode: str = "loop"
    second_delay: float = 0.0
    loop_seconds: float = 20.0
    #: a file where each victim appends the wall-clock time of its SIGKILL ("" for none)
    kill_log: str = ""


def _kill_later(seconds: float, log: str = "") -> None:
    """SIGKILL this process in ``seconds``, first writing the wall-clock time to ``log``."""
    def fire() -> None:
        time.sleep(seconds)
        if log:
            with open(log, "a") as f:
                f.write(f"{time.time()!r}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=fire, daemon=True).start()


def _check(ok: bool, what: str, comm: Any, step: int) -> None:
    if not ok:
        raise WrongResult(f"rank {comm.rank}/{comm.size}: {what} at step {step} gave a wrong "
                          "result")


def mixed_step(comm: Any, step: int, agree_every: int = 5,
               before_agree: Any = None) -> None:
    """One round of every kind of call, each result checked against what it must be
    (``before_agree()``: called right before the round's agree, if it has one)."""
    n, r = comm.size, comm.rank
    count = COUNTS[step % len(COUNTS)]
    base = float(step % 97)
    x = np.full(count, base + r + 1, dtype=np.float64)
    comm.allreduce(x)
    _check(bool(np.all(x == n * base + n * (n + 1) / 2)), "allreduce", comm, step)
    root = step % n
    b = np.full(count, base + r, dtype=np.float64)
    comm.broadcast(b, root=root)
    _check(bool(np.all(b == base + root)), "broadcast", comm, step)
    g_in = np.full(count, base + r, dtype=np.float64)
    g_out = np.empty(count * n, dtype=np.float64)
    comm.allgather(g_out, g_in)
    _check(bool(np.all(g_out.reshape(n, count) == (base + np.arange(n))[:, None])),
           "allgather", comm, step)
    rs_in = np.full(count * n, base + r, dtype=np.float64)
    rs_out = np.empty(count, dtype=np.float64)
    comm.reduce_scatter(rs_out, rs_in)
    _check(bool(np.all(rs_out == n * base + n * (n - 1) / 2)), "reduce_scatter", comm, step)
    a_in = (np.arange(n, dtype=np.float64)[:, None] + 100 * r).repeat(max(1, count // n), 1)
    a_out = np.empty_like(a_in)
    comm.alltoall(a_out, a_in)
    _check(bool(np.all(a_out == (r + 100 * np.arange(n, dtype=np.float64))[:, None])),
           "alltoall", comm, step)
    sent = np.full(count, base + r, dtype=np.float64)
    got = np.empty(count, dtype=np.float64)
    right, left = (r + 1) % n, (r - 1) % n
    if r % 2 == 0:
        comm.send(sent, right)
        comm.recv(got, left)
    else:
        comm.recv(got, left)
        comm.send(sent, right)
    _check(bool(np.all(got == base + left)), "send/recv", comm, step)
    if agree_every and step % agree_every == agree_every - 1:
        if before_agree is not None:
            before_agree()
        flag, gone = comm.agree(1)
        if gone:       # a death seen by the agreement: the loop's failure, as any other
            from pycoll import PeerLost
            raise PeerLost(f"rank {r}: agree found ranks {sorted(gone)} gone", peer=min(gone))
        _check(flag == 1, "agree", comm, step)


def trial_rank(comm: Any, plan: Plan) -> dict[str, Any]:
    """One rank's part of a trial (``run_ranks`` target); what it saw, with timings."""
    import pycoll

    me = comm.rank
    if os.environ.get("PYCOLL_JOIN") == "1":          # the joiner of "grow" modes
        comm, report = recover(comm, plan, -1, need_shrink=False, grown=True)
        return dict(report, rank=-1, joined=True, final_size=comm.size, final_rank=comm.rank)
    start = time.monotonic()
    armed = False

    def arm_in_agree() -> None:           # mode "agree": the victim dies inside an agree
        nonlocal armed
        if not armed and time.monotonic() - start > plan.delay:
            armed = True
            _kill_later(plan.second_delay, plan.kill_log)

    if me == plan.victim and plan.mode != "agree":
        _kill_later(plan.delay, plan.kill_log)
    hook = arm_in_agree if me == plan.victim and plan.mode == "agree" else None
    step = 0
    while time.monotonic() - start < plan.loop_seconds:
        try:
            mixed_step(comm, step, before_agree=hook)
        except WrongResult:
            raise
        except pycoll.PycollError as e:
            failed_at, failed_wall = time.monotonic(), time.time()
            comm, report = recover(comm, plan, me, need_shrink=True,
                                   grown=not plan.mode.startswith("grow"))
            first_ok = report.pop("first_ok")
            return dict(report, rank=me, steps=step, error=type(e).__name__ + report["error"],
                        first_error=str(e)[:600],
                        final_size=comm.size, final_rank=comm.rank, failed_wall=failed_wall,
                        recovery_s=None if first_ok is None else first_ok - failed_at)
        step += 1
    return {"rank": me, "steps": step, "error": "", "final_size": comm.size, "recoveries": 0}


def recover(comm: Any, plan: Plan, me: int, need_shrink: bool,
            grown: bool) -> tuple[Any, dict]:
    """Shrink (and for "grow" modes grow by the waiting joiner) until checked steps and a
    closing agree go through with nobody gone: the ULFM pattern, where the agreement makes
    every survivor leave the loop in the same state. ``me``: this rank in the first
    communicator (-1: the joiner). ``Excluded`` (a rank cut off from the store, which the
    others found gone) is raised: shrinking again cannot bring it back."""
    import pycoll

    report: dict[str, Any] = {"error": "", "first_ok": None, "grow_s": None,
                              "final_ok": False, "recoveries": 0}
    armed = False
    while report["recoveries"] < MAX_RECOVERIES:
        report["recoveries"] += 1
        if plan.second == me and not armed and plan.mode in ("shrink", "growkill"):
            # dies while the survivors shrink ("shrink") or grow ("growkill")
            armed = True
            if plan.mode == "shrink":
                _kill_later(plan.second_delay)
        try:
            if need_shrink:
                comm = comm.shrink()
                need_shrink = False
            grew_at = None
            if not grown:
                if armed and plan.mode == "growkill":
                    _kill_later(plan.second_delay)
                wait_until = time.monotonic() + 60.0      # the joiner's start is not timed
                while comm.joiners_waiting() < 1 and time.monotonic() < wait_until:
                    time.sleep(0.01)
                grew_at = time.monotonic()
                comm = comm.grow(1, timeout=60.0)
                grown = True
            base = 100_000 * int(comm.name.rsplit("~", 1)[-1]) if "~" in comm.name else 0
            for k in range(AFTER_STEPS):       # numbered alike on every member
                mixed_step(comm, base + k, agree_every=0)
                if report["first_ok"] is None:
                    report["first_ok"] = time.monotonic()
                if grew_at is not None and report["grow_s"] is None:
                    report["grow_s"] = time.monotonic() - grew_at
            _, gone = comm.agree(1)
            if not gone:
                report["final_ok"] = True
                return comm, report
            need_shrink = True
        except (WrongResult, pycoll.Excluded):
            raise         # Excluded: the others went on without this rank; it must leave
        except pycoll.PycollError as e:
            report["error"] += f" -> {type(e).__name__}"
            need_shrink = True
    return comm, report


@dataclass
class TrialResult:
    ok: bool
    why: str
    survivors: list[dict[str, Any]]
    dead: list[int]
    recovery_s: list[float]
    #: seconds from the first victim's SIGKILL to each survivor's error (None: no kill log)
    detection_s: list[float] | None = None
    #: "grow" modes: seconds from a member's grow call to its first collective on the
    #: grown communicator (the joiner waited in the lobby: its start is not in it)
    grow_s: list[float] | None = None


def judge(outcomes: list[tuple[str, Any]], plan: Plan, n: int) -> TrialResult:
    """Whether a trial (``run_ranks(..., expect_failure=True)``'s outcomes) passed."""
    dead = [r for r, (kind, _) in enumerate(outcomes) if kind == "missing"]
    joiners = len(outcomes) - n
    expected_dead = {plan.victim} | ({plan.second} if plan.second is not None else set())
    errors = {r: o for r, o in enumerate(outcomes) if o[0] not in ("ok", "missing")}
    survivors = [v for k, v in outcomes if k == "ok"]
    recovery = [s["recovery_s"] for s in survivors if s.get("recovery_s") is not None]
    if errors:
        r, (kind, tb) = next(iter(errors.items()))
        return TrialResult(False, f"rank {r} raised {kind}: {str(tb)[-1500:]}", survivors,
                           dead, recovery)
    if not set(dead) <= expected_dead or plan.victim not in dead:
        return TrialResult(False, f"dead ranks {dead}, expected {sorted(expected_dead)}",
                           survivors, dead, recovery)
    want = n + joiners - len(dead)
    sizes = {s["final_size"] for s in survivors}
    ranks = sorted(s.get("final_rank", -1) for s in survivors)
    if sizes != {want} or ranks != list(range(want)):
        return TrialResult(False, f"survivors ended on sizes {sizes} with ranks {ranks}, "
                                  f"expected {want} ranks 0..{want - 1}", survivors, dead,
                           recovery)
    if not all(s.get("final_ok") for s in survivors):
        return TrialResult(False, "a survivor never completed a collective after shrinking",
                           survivors, dead, recovery)
    grow = [s["grow_s"] for s in survivors if s.get("grow_s") is not None]
    return TrialResult(True, "", survivors, dead, recovery, grow_s=grow or None)


def random_plan(n: int, mode: str, rng: random.Random) -> Plan:
    """A victim at a random moment of the loop (after a short warm-up; "agree": inside an
    agree, a few milliseconds after it starts); "shrink"/"growkill": a second victim,
    another rank, dying a few milliseconds into the survivors' shrink / grow ("grow",
    "growkill": the survivors then admit a joiner that waited since the start)."""
    victim = rng.randrange(n)
    second = (rng.choice([r for r in range(n) if r != victim])
              if mode in ("shrink", "growkill") else None)
    return Plan(victim=victim, delay=rng.uniform(0.2, 0.8), second=second, mode=mode,
                second_delay=rng.uniform(0.0, 0.003 if mode == "agree" else 0.02))


def run_trial(n: int, transport: str, mode: str, seed: int,
              timeout: float = 90.0) -> TrialResult:
    """One trial on ``n`` forked ranks of this host over ``transport``."""
    import tempfile

    from .. import fastpath
    from . import run_ranks

    if fastpath.probe_limit():
        fastpath.warm()      # once per process: forked ranks inherit the loaded kernels
    rng = random.Random(seed)
    plan = random_plan(n, mode, rng)
    with tempfile.TemporaryDirectory(prefix="pycoll-elastic-") as tmp:
        plan.kill_log = os.path.join(tmp, "kills")
        outcomes = run_ranks(trial_rank, n, plan, env={"PYCOLL_TRANSPORTS": transport},
                             expect_failure=True, timeout=timeout, collective_timeout=30.0,
                             joiners=1 if mode.startswith("grow") else 0)
        result = judge(outcomes, plan, n)
        result.detection_s = detection(plan.kill_log, result.survivors)
    return result


def detection(kill_log: str, survivors: list[dict[str, Any]]) -> list[float] | None:
    """Seconds from the first SIGKILL in ``kill_log`` to each survivor's first error."""
    try:
        with open(kill_log) as f:
            first = min(float(line) for line in f if line.strip())
    except (OSError, ValueError):
        return None
    return [s["failed_wall"] - first for s in survivors if s.get("failed_wall")]
