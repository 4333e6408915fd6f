"""Elastic recovery across namespace hosts: kill -9 and pulled cables, survivors shrink.

Each trial (``tests/multihost/elastic_jobs.py``): 4 namespace hosts x 2 ranks (shm on a host,
tcp between hosts) loop on mixed, checked collectives with the store in a fifth namespace of
its own and ``PYCOLL_SOCKET_DEAD_MS`` 3000; at a random moment one fault: ``kill`` (SIGKILL to
one rank), ``host`` (SIGKILL to both ranks of one host), ``cable`` (one host's eth0 down: its
ranks are cut off from the store and the others). Every survivor shrinks and runs checked
collectives and a closing agree on the shrunk communicator; a trial passes when all of them
end on the same communicator of the world less the lost ranks, ranked 0..m-1, with every
result right, every survivor exits 0 and every cut-off rank exits by itself within 60 s.

Reported per fault, over every survivor of every passed trial (p50 / p99 / max):
*detection*, the fault to the survivor's first error (for ``cable`` the link-down detection,
reported apart as the issue asks), *recovery*, that error to its first successful collective
on the shrunk communicator, and for ``cable`` how long the cut-off ranks took to exit.

Needs root, ``ip`` and ``unshare``; writes ``<--name>.json`` and ``<--name>.md`` (default
``hosts``) into ``--out``::

    python benchmarks/elastic_hosts.py --trials 20 --faults kill,host,cable

Trial k of a fault draws its victim and moment from ``random.Random(f"{fault}-{seed + k}")``:
``--seed S --trials 1 --faults F`` repeats trial S of F (its draws; timing is the machine's).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from elastic_trials import fmt, quantiles  # noqa: E402  (this folder)
from multihost.elastic_jobs import (  # noqa: E402
    FAULTS,
    HOSTS,
    PER_HOST,
    ElasticTrial,
    elastic_trial,
)

from pycoll.testing.hosts import NamespaceHosts, chosen_cases  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "out" / "elastic-recovery"


def record(trial: ElasticTrial, seed: int, wall: float) -> dict:
    """What the json keeps of one trial."""
    outcomes = {r: res["outcome"] for r, res in sorted(trial.results.items())}
    errors = {r: res["error"] for r, res in sorted(trial.results.items())
              if r in trial.survivors}
    messages = {r: res["message"].split("\n")[0][:400] for r, res in sorted(trial.results.items())
                if r in trial.survivors}
    return {"seed": seed, "target": trial.target,
            "problems": trial.problems(), "wall_s": round(wall, 2),
            "detection_s": [round(x, 4) for x in trial.detection()],
            "recovery_s": [round(x, 4) for x in trial.recovery()],
            "recoveries": {r: res["recoveries"] for r, res in sorted(trial.results.items())
                           if r in trial.survivors},
            "first_errors": errors, "first_messages": messages, "outcomes": outcomes,
            "lost": trial.lost_details(),
            "exits": {r: [code, None if t is None else round(t, 3)]
                      for r, (code, t) in sorted(trial.exits.items())}}


def run_fault(hosts: NamespaceHosts, fault: str, trials: int, seed: int,
              keep: Path | None = None) -> dict:
    """``trials`` trials of ``fault``; ``keep``: where the files and logs of the ranks of a
    failed trial are copied (``<fault>-<seed>``)."""
    rows, detection, recovery, cutoff = [], [], [], []
    started = time.monotonic()
    for k in range(trials):
        with tempfile.TemporaryDirectory(prefix="pycoll-elastic-hosts-") as tmp:
            t0 = time.monotonic()
            trial = elastic_trial(hosts, fault, Path(tmp), random.Random(f"{fault}-{seed + k}"))
            row = record(trial, seed + k, time.monotonic() - t0)
            if keep is not None and row["problems"]:
                shutil.copytree(tmp, keep / f"{fault}-{seed + k}")
        rows.append(row)
        if not row["problems"]:
            detection += trial.detection()
            recovery += trial.recovery()
            cutoff += trial.cutoff_exits()
        print(f"  {fault} trial {k + 1}/{trials} (seed {seed + k}, {trial.target}): "
              f"{'ok' if not row['problems'] else row['problems']}; detection "
              f"{fmt(max(row['detection_s'], default=None))}, recovery "
              f"{fmt(max(row['recovery_s'], default=None))} (worst survivor)", flush=True)
    return {"fault": fault, "trials": trials, "passed": sum(not r["problems"] for r in rows),
            "detection_s": quantiles(detection), "recovery_s": quantiles(recovery),
            "cutoff_exit_s": quantiles(cutoff) if fault == "cable" else None,
            "samples": len(recovery), "wall_s": round(time.monotonic() - started, 1),
            "trial_details": rows}


def table(rows: list[dict]) -> str:
    lines = ["| fault | passed | detection p50 | p99 | max | recovery p50 | p99 | max | "
             "survivors measured |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, v = r["detection_s"], r["recovery_s"]
        lines.append(f"| {r['fault']} | {r['passed']}/{r['trials']} | {fmt(d['p50'])} | "
                     f"{fmt(d['p99'])} | {fmt(d['max'])} | {fmt(v['p50'])} | {fmt(v['p99'])} "
                     f"| {fmt(v['max'])} | {r['samples']} |")
    return "\n".join(lines)


def markdown(meta: dict, rows: list[dict]) -> str:
    md = [f"# Elastic recovery across hosts ({meta['date']})", "",
          f"`python benchmarks/{meta['command']}` on {meta['cpus']} CPUs shared with other "
          f"work (load average {meta['load_before']} before, {meta['load_after']} after), "
          f"kernel {meta['kernel']}, Python {meta['python']}. {HOSTS} namespace hosts x "
          f"{PER_HOST} ranks, the store in a fifth namespace, PYCOLL_SOCKET_DEAD_MS=3000, "
          "collective and shrink deadline 30 s. Over every survivor of every passed trial: "
          "detection = the fault to the survivor's first error (cable: the link-down "
          "detection), recovery = that error to its first successful collective on the "
          "shrunk communicator.", "", table(rows), ""]
    for r in rows:
        c = r["cutoff_exit_s"]
        if c is not None:
            ends: dict[str, int] = {}
            for t in r["trial_details"]:
                for lost in t["lost"].values():
                    raised = (lost["last_error"] or lost["error"] or "").split(":")[0]
                    end = f"{lost['outcome']} ({raised})"
                    ends[end] = ends.get(end, 0) + 1
            md.append(f"* {r['fault']}: the cut-off ranks exited by themselves {fmt(c['p50'])} "
                      f"(p50) / {fmt(c['p99'])} (p99) / {fmt(c['max'])} (max) after the cable "
                      "was pulled; how they ended: "
                      + ", ".join(f"{k} x{n}" for k, n in sorted(ends.items())))
        kinds: dict[str, int] = {}
        for t in r["trial_details"]:
            for e in t["first_errors"].values():
                kinds[e] = kinds.get(e, 0) + 1
        md.append(f"* {r['fault']}: survivors' first errors: "
                  + ", ".join(f"{k or '(none)'} x{n}" for k, n in sorted(kinds.items())))
        for t in r["trial_details"]:
            for p in t["problems"]:
                md.append(f"* {r['fault']} seed {t['seed']}: FAILED: "
                          + p[:600].replace("\n", " "))
    return "\n".join(md) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="trials per fault")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help=f"comma-separated, of {', '.join(FAULTS)}")
    ap.add_argument("--seed", type=int, default=0, help="the first trial's seed")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the json and md")
    ap.add_argument("--name", default="hosts", help="their file name, less the suffix")
    ap.add_argument("--keep", default="", help="copy the ranks' files and logs of every "
                    "failed trial into this folder")
    args = ap.parse_args(argv)
    faults = chosen_cases(ap, args.faults, FAULTS, "fault")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version(),
            "load_before": round(os.getloadavg()[0], 1),
            "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])}
    rows = []
    with NamespaceHosts(HOSTS + 1) as hosts:
        for fault in faults:
            rows.append(run_fault(hosts, fault, args.trials, args.seed,
                                  Path(args.keep) if args.keep else None))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    meta["load_after"] = round(os.getloadavg()[0], 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / f"{args.name}.md").write_text(markdown(meta, rows))
    print(table(rows))
    print(f"wrote {out / args.name}.json and .md")
    return 0 if all(r["passed"] == r["trials"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
