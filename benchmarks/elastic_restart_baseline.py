"""Baseline of issue 27: how long torchrun --max-restarts takes to bring a Gloo DDP job back.

What a user does today when a rank dies: torchrun notices the dead worker, stops the others,
runs a new rendezvous round and starts every worker again; each imports torch, joins a new
process group, loads the last checkpoint and trains on. This script measures that, so that
pycoll's shrink-on-survivors can be compared with it in the same run on the same machine.

Each trial is a fresh job in a temporary folder: benchmarks/elastic_restart_train.py (a small
MLP on synthetic data, rank 0 checkpointing every K steps), copied there and launched with

    python -m torch.distributed.run --standalone --nproc-per-node N --max-restarts 1 train.py

After the victim rank has completed step S, it gets SIGKILL. The workers log the time of each
phase (see elastic_restart_train.py), so the recovery splits into the agent's part (the kill to
the first new process: detection, stopping the survivors, the new rendezvous, spawning) and
the workers' part (process start + imports + init_process_group + model and optimizer +
checkpoint load + DDP).

`--store private` (the default) sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with torchrun's
default the workers' process group lives in the agent's store, which outlives the restart
with the dead generation's Gloo addresses in it; a restarted rank that reads one before its
peer rewrote it fails in connectFullMesh ("Connection refused") and the job dies (pytorch
issue 135712). `--store shared` measures that default and counts the failed restarts.

    python benchmarks/elastic_restart_baseline.py                # 4 ranks, 5 trials
    python benchmarks/elastic_restart_baseline.py --trials 10 --nproc 2 --out /tmp/x
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "elastic_restart_train.py")
DEFAULT_OUT = os.path.join(HERE, "out", "elastic-recovery")
NAME = "torchrun-gloo-restart"
POLL_S = 0.02
# the workers' milestones in the order they happen; "step" lines follow
PHASES = ("start", "imports", "init_process_group", "model", "checkpoint", "ddp")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
Event = tuple[float, str, int, int, int]   # time, event, value, rank, restart


class TrialError(RuntimeError):
    """A trial that did not go kill -> restart -> clean exit: `reason` in a line, and the end
    of torchrun's output."""

    def __init__(self, reason: str, output: str = "") -> None:
        super().__init__(reason)
        self.reason, self.output = reason, output


def read_events(folder: str) -> list[Event]:
    """Every line the workers wrote so far (a line cut by the kill has fewer fields)."""
    events = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("rank") and name.endswith(".log"):
            with open(os.path.join(folder, name)) as fh:
                for line in fh:
                    f = line.split()
                    if len(f) == 5:
                        events.append((float(f[0]), f[1], int(f[2]), int(f[3]), int(f[4])))
    return events


def pids_naming(marker: str) -> list[int]:
    """Processes whose command line names `marker` (the trial's own folder: torchrun and its
    workers, which torchrun starts in sessions of their own)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def reap(job: subprocess.Popen, marker: str) -> None:
    """Stop the torchrun process group (SIGTERM lets the agent stop its workers; SIGKILL
    after 10 s), then SIGKILL any worker left, until none is (10 s at most)."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGTERM)
        try:
            job.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(10)
    deadline = time.monotonic() + 10
    while (left := pids_naming(marker)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(POLL_S)
    if left:
        raise TrialError(f"processes {left} of the job outlived SIGKILL for 10 s")


def failure(what: str, log: str) -> TrialError:
    """A TrialError that names the first worker error torchrun's output shows after the kill
    (before it, the survivors' errors are the kill's expected consequence)."""
    with open(log, errors="replace") as fh:
        out = fh.read()
    after_kill = out.split("(exitcode: -9)", 1)[-1]
    errors = [m for m in re.findall(r"^(?:\[rank\d+\]: )?\s*(?:[\w.]+\.)?(\w*Error: .+)$",
                                    after_kill, re.M)
              if not m.startswith("ChildFailedError")]
    return TrialError(what + (f": {errors[0][:300]}" if errors else ""), out[-3000:])


def exit_note(rc: int, log: str) -> str:
    """Why torchrun exited with `rc` after every rank's last step: its root-cause rank and
    exit code, and a C++ runtime's last words if there were any."""
    with open(log, errors="replace") as fh:
        out = fh.read()
    root = out.split("Root Cause", 1)[-1]
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    code = re.search(r"exitcode\s*:\s*(-?\d+)[^\n]*?(\(SIG\w+\))?[ \t]*$", root, re.M)
    words = re.search(r"^terminate called.*$", out, re.M)
    return (f"torchrun exited with {rc} after every rank's last step"
            + (f"; rank {rank.group(1)} exit code {code.group(1)} {code.group(2) or ''}"
               .rstrip() if rank and code else "")
            + (f"; {words.group(0)!r}" if words else ""))


def wait_until(what: str, done: Callable[[], bool], job: subprocess.Popen, deadline: float,
               log: str) -> None:
    while not done():
        if job.poll() is not None:
            raise failure(f"torchrun exited (rc {job.returncode}) before {what}", log)
        if time.monotonic() > deadline:
            raise failure(f"{what}: not seen within --trial-timeout", log)
        time.sleep(POLL_S)


def torchrun_command(args: argparse.Namespace, script: str, folder: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(args.nproc), "--max-restarts", "1", script, folder,
            str(args.kill_after + args.steps_after), str(args.ckpt_every), str(args.seed)]


def job_env(args: argparse.Namespace, folder: str) -> dict[str, str]:
    """The caller's environment without launcher variables; temporary files (torchrun's log
    folder too) go into the trial's folder, Gloo stays on loopback."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith("TORCHELASTIC_")}
    env.update(TMPDIR=folder, GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    if args.store == "private":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def run_trial(args: argparse.Namespace, victim: int) -> dict:
    """One job: start it, kill the victim after step --kill-after, wait for the restarted
    job to finish; returns the trial's timeline (seconds after the kill)."""
    folder = tempfile.mkdtemp(prefix="elastic-baseline-")
    log = os.path.join(folder, "torchrun.out")
    script = shutil.copy(TRAIN, os.path.join(folder, "train.py"))
    deadline = time.monotonic() + args.trial_timeout
    try:
        with open(log, "w") as out:
            job = subprocess.Popen(torchrun_command(args, script, folder), stdout=out,
                                   stderr=subprocess.STDOUT, env=job_env(args, folder),
                                   start_new_session=True, cwd=folder)
        try:
            def victim_done() -> bool:
                return any(e[1] == "step" and e[2] >= args.kill_after and e[3] == victim
                           for e in read_events(folder))
            wait_until(f"step {args.kill_after} of rank {victim}", victim_done, job,
                       deadline, log)
            pid = next(e[2] for e in read_events(folder)
                       if e[1] == "script" and e[3] == victim and e[4] == 0)
            t_kill = time.time()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                raise TrialError(f"rank {victim} had finished before its kill: raise "
                                 "--steps-after") from None

            def all_restarted() -> bool:
                return {e[3] for e in read_events(folder)
                        if e[1] == "step" and e[4] == 1} == set(range(args.nproc))
            wait_until("a step of every rank after the restart", all_restarted, job,
                       deadline, log)
            try:
                rc = job.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise failure("the restarted job did not finish within --trial-timeout",
                              log) from None
            events = read_events(folder)
            total = args.kill_after + args.steps_after
            trained = {e[3] for e in events if e[1] == "step" and e[2] == total and e[4] == 1}
            if rc != 0 and len(trained) < args.nproc:
                raise failure(f"torchrun exited with {rc} after the restart", log)
            t = timeline(events, t_kill, victim, args.nproc)
            # the restart worked, and what happened after the last step is not recovery
            # time, but a user sees the job fail: each such exit is counted in the report
            t["exit"] = exit_note(rc, log) if rc != 0 else None
            return t
        except TrialError as exc:
            exc.reason += "; last logged: " + last_logged(read_events(folder))
            raise
        finally:
            reap(job, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def last_logged(events: list[Event]) -> str:
    """Where each rank got to, e.g. 'rank 0 step 31 (restart 1)', for a failed trial."""
    last = {rank: (ev, v, rs) for _, ev, v, rank, rs in events}
    return ", ".join(f"rank {r} {ev} {v} (restart {rs})" for r, (ev, v, rs) in sorted(last.items()))


def timeline(events: list[Event], t_kill: float, victim: int, nproc: int) -> dict:
    """A trial's numbers from its event lines, seconds after the kill: each milestone of the
    restarted group (restart 1) on every rank, and the headline intervals."""
    def at(event: str, restart: int) -> dict[int, float]:
        out: dict[int, float] = {}
        for t, ev, _, rank, rs in events:
            if ev == event and rs == restart and rank not in out:
                out[rank] = t
        return out

    before = [(t, v, rank) for t, ev, v, rank, rs in events if ev == "step" and rs == 0]
    kill_step = max(v for t, v, _ in before if t <= t_kill)
    resumed = {v for _, ev, v, _, rs in events if ev == "checkpoint" and rs == 1}
    if len(resumed) == 1:
        # the checkpoint the restart resumed from was written before the kill, so its step
        # was done, even when that step's log line is stamped after the kill (a loaded
        # machine: seen once in a full test run, "resumed from [9], killed after step 8")
        kill_step = max(kill_step, next(iter(resumed)))
    after = {p: at(p, 1) for p in (*PHASES, "step")}
    caught_up = [t for t, ev, v, _, rs in events
                 if ev == "step" and rs == 1 and v == kill_step + 1]
    if len(resumed) != 1 or any(len(r) != nproc for r in after.values()) \
            or len(caught_up) != nproc:
        raise TrialError(f"the restarted ranks' logs are incomplete or disagree (resumed "
                         f"from {sorted(resumed)}, killed after step {kill_step})")
    first = {p: min(after[p].values()) - t_kill for p in after}
    last = {p: max(after[p].values()) - t_kill for p in after}
    initial = {p: at(p, 0).values() for p in ("start", "ddp")}
    return {
        "victim": victim, "kill_step": kill_step, "resumed_from": resumed.pop(),
        "first_step_any_s": first["step"], "first_step_all_s": last["step"],
        "progress_s": max(caught_up) - t_kill,
        "respawn_s": first["start"],
        "startup_s": last["ddp"] - first["start"],
        "initial_startup_s": max(initial["ddp"]) - min(initial["start"]),
        "step_ms": 1e3 * float(np.median(np.diff([t for t, _, r in before if r == 0]))),
        "last_rank_s": last,
        "per_rank_s": {str(r): {p: after[p][r] - t_kill for p in after} for r in range(nproc)},
    }


HEADLINES = (
    ("first_step_any_s", "the first step after the restart, first rank"),
    ("first_step_all_s", "the first step after the restart, every rank"),
    ("progress_s", "every rank past the step the job had reached at the kill"),
    ("respawn_s", "the first new worker process (the agent: detection, stopping the "
                  "survivors, rendezvous, spawn)"),
    ("startup_s", "startup: first new process to every rank ready (process start, imports, "
                  "init_process_group, model and optimizer, checkpoint load, DDP)"),
)
MILESTONES = (("start", "its process started"), ("imports", "imports done (torch)"),
              ("init_process_group", "init_process_group returned"),
              ("model", "model and optimizer built"), ("checkpoint", "checkpoint loaded"),
              ("ddp", "DDP constructed"),
              ("step", "its first step done"))
RANK_PHASES = (("start", "imports", "process start to imports done"),
               ("imports", "init_process_group", "init_process_group"),
               ("init_process_group", "model", "model and optimizer (the first optimizer "
                "imports torch._dynamo)"),
               ("model", "checkpoint", "checkpoint load"),
               ("checkpoint", "ddp", "DDP construction"), ("ddp", "step", "first step"))


def stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "min": float(a.min()), "max": float(a.max())}


def summarise(trials: list[dict]) -> dict:
    out = {key: stats([t[key] for t in trials]) for key, _ in HEADLINES}
    for p, _ in MILESTONES:
        out[f"last_rank_{p}_s"] = stats([t["last_rank_s"][p] for t in trials])
    # one rank's own phases (the median rank of each trial): what a process spends where
    for a, b, _ in RANK_PHASES:
        out[f"rank_{a}_to_{b}_s"] = stats(
            [float(np.median([r[b] - r[a] for r in t["per_rank_s"].values()])) for t in trials])
    out["initial_startup_s"] = stats([t["initial_startup_s"] for t in trials])
    return out


def machine() -> dict:
    import torch
    return {"nproc": os.cpu_count(), "loadavg_start": os.getloadavg(),
            "python": platform.python_version(), "torch": torch.__version__,
            "kernel": platform.release(), "date": time.strftime("%Y-%m-%d %H:%M")}


def markdown(result: dict) -> str:
    a, s, m, trials = result["args"], result["summary"], result["machine"], result["trials"]
    store = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (each generation's rank 0 hosts a new "
             "store; torchrun's default store fails the restarts, "
             "see torchrun-gloo-restart-shared-store.md)" if a["store"] == "private"
             else "torchrun's default store, the agent's: it outlives the restart, and the "
             "restarted ranks can read the killed generation's Gloo addresses from it "
             "(pytorch/pytorch#135712)")
    lines = [
        "# torchrun --max-restarts: a Gloo DDP job after kill -9 of one rank", "",
        f"`{result['command']}`", "",
        f"{m['date']}, {a['trials']} trials (each a fresh job), {a['nproc']} ranks on "
        f"{m['nproc']} CPUs shared with other work (load average "
        f"{', '.join(f'{x:.1f}' for x in m['loadavg_start'])} at the start), torch "
        f"{m['torch']}, Python {m['python']}.", "",
        f"Job: `{result['torchrun']}` (benchmarks/elastic_restart_train.py): an MLP of 4 "
        f"layers of 256 (Adam, batch 32 per rank, synthetic data, seed {a['seed']}); rank 0 "
        f"checkpoints every {a['ckpt_every']} steps (torch.save of model + optimizer + "
        f"step); rank {result['victim']} gets SIGKILL after its step {a['kill_after']}. "
        f"Store: {store}. torchrun's defaults otherwise (c10d rendezvous, monitor interval "
        "0.1 s), GLOO_SOCKET_IFNAME=lo, OMP_NUM_THREADS=1 (torchrun's).", "",
        f"Restarts that trained again: {len(trials)} of {a['trials']}.",
    ]
    for f in result["failures"]:
        lines.append(f"- trial {f['trial']} failed: {f['reason']}")
    exits = [t["exit"] for t in trials if t["exit"]]
    if exits:
        lines += ["", f"Jobs that trained to their last step after the restart and then "
                      f"exited non-zero all the same: {len(exits)} (torchrun reports the job "
                      "failed; their recovery times are in the tables):",
                  *(f"- {e}" for e in exits)]
    if not trials:
        return "\n".join([*lines, ""])

    head = ["", "| | p50 | p99 | min | max |", "|---|---|---|---|---|"]

    def row(label: str, key: str) -> str:
        st = s[key]
        return (f"| {label} | {st['p50']:.2f} | {st['p99']:.2f} | {st['min']:.2f} | "
                f"{st['max']:.2f} |")

    lines += ["", "Seconds from the kill to:", *head,
              *(row(label, key) for key, label in HEADLINES), "",
              "Seconds from the kill until the last rank of the new group passed each point "
              "(the critical path):", *head,
              *(row(label, f"last_rank_{p}_s") for p, label in MILESTONES), "",
              "One rank's own phases after the restart (seconds, the median rank of each "
              "trial):", *head,
              *(row(label, f"rank_{x}_to_{y}_s") for x, y, label in RANK_PHASES), "",
              "For comparison, the job's first start (first process to every rank ready): "
              f"p50 {s['initial_startup_s']['p50']:.2f} s. A step before the kill: "
              f"{np.median([t['step_ms'] for t in trials]):.1f} ms (median). Killed after "
              f"steps {', '.join(str(t['kill_step']) for t in trials)}; resumed from "
              f"{', '.join(str(t['resumed_from']) for t in trials)}.", ""]
    if a["nproc"] > (m["nproc"] or 1):
        lines += [f"{a['nproc']} ranks on {m['nproc']} cores: the restarted ranks import "
                  "torch at the same time on fewer cores than ranks, so the startup part is "
                  "longer here than with a core per rank.", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    ap.add_argument("--trials", type=int, default=5, help="fresh jobs (default 5)")
    ap.add_argument("--kill-after", type=int, default=35,
                    help="SIGKILL the victim once it completed this step (default 35: half a "
                         "checkpoint interval of work is lost, as on average)")
    ap.add_argument("--ckpt-every", type=int, default=10,
                    help="rank 0 checkpoints every K steps (default 10)")
    ap.add_argument("--steps-after", type=int, default=50,
                    help="the job runs this many steps past --kill-after (default 50)")
    ap.add_argument("--victim", type=int, default=-1, help="rank to kill (default the last)")
    ap.add_argument("--store", choices=("private", "shared"), default="private",
                    help="private: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (default); shared: "
                         "torchrun's default store, whose restarts fail (see above)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trial-timeout", type=float, default=300,
                    help="seconds one job may take, start to exit (default 300)")
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help=f"folder for {NAME}[-shared-store].json and .md (default "
                         f"{os.path.relpath(DEFAULT_OUT)}); '-' writes nothing")
    args = ap.parse_args(argv)
    if args.nproc < 2 or not -args.nproc <= args.victim < args.nproc:
        ap.error("--nproc must be at least 2 and --victim one of its ranks")
    if min(args.trials, args.ckpt_every, args.steps_after, args.kill_after) < 1:
        ap.error("--trials, --ckpt-every, --steps-after and --kill-after must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    victim = args.victim % args.nproc
    command = "python benchmarks/elastic_restart_baseline.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    print(f"# torchrun --max-restarts 1, Gloo DDP, {args.nproc} ranks, {args.store} store, "
          f"kill -9 of rank {victim} after step {args.kill_after}, {args.trials} trials")
    print("# seconds from the kill to:  respawn  startup  first step (any/all)  progress")
    info, trials, failures = machine(), [], []
    for i in range(args.trials):
        try:
            t = run_trial(args, victim)
        except TrialError as exc:
            failures.append({"trial": i, "reason": exc.reason, "output_tail": exc.output})
            print(f"  trial {i}: FAILED: {exc.reason}", flush=True)
            continue
        trials.append(t)
        print(f"  trial {i}: {t['respawn_s']:7.2f}  {t['startup_s']:7.2f}  "
              f"{t['first_step_any_s']:9.2f} / {t['first_step_all_s']:.2f}  "
              f"{t['progress_s']:9.2f}   (killed after step {t['kill_step']}, resumed "
              f"from {t['resumed_from']})", flush=True)
    result = {"command": command, "args": vars(args), "victim": victim, "machine": info,
              "torchrun": shlex.join(["python", *torchrun_command(args, "train.py",
                                                                  "LOGDIR")[1:]]),
              "summary": summarise(trials) if trials else {}, "trials": trials,
              "failures": failures}
    print(f"# restarts that trained again: {len(trials)} of {args.trials}")
    for key, label in HEADLINES if trials else ():
        st = result["summary"][key]
        print(f"# {label}: p50 {st['p50']:.2f} s, p99 {st['p99']:.2f}, min {st['min']:.2f}, "
              f"max {st['max']:.2f}")
    if args.out != "-":
        name = NAME + ("-shared-store" if args.store == "shared" else "")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{name}.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        with open(os.path.join(args.out, f"{name}.md"), "w") as fh:
            fh.write(markdown(result))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
