"""Faults across hosts: how long until every survivor knows, and whom it names.

Runs the jobs of ``tests/multihost/test_faults_across_hosts.py`` many times on namespace
hosts (``pycoll.testing.hosts``: one real machine, each "host" a network namespace with its
own hostname, address and link; ranks on one host talk shm, between hosts tcp). In each
trial the ranks loop on allreduces (8 B and 1 MiB alternately) with
``PYCOLL_SOCKET_DEAD_MS`` (default 3000) and a 60 s collective deadline, and one fault comes
a random 20-150 ms after every rank finished its first collectives:

* ``link-down``  2 hosts x 2 ranks, host 1's eth0 goes down (both sides survive);
* ``host-kill``  2 hosts x 2 ranks, SIGKILL to every rank of host 1;
* ``partition``  4 hosts x 2 ranks, hosts {0,1} and {2,3} can no longer reach each other;
* ``launcher``   (not by default) ``pycoll.run --nnodes 2`` on 2 hosts x 2 ranks, host 1's
  launcher and ranks killed: how long node 0's launcher takes to exit non-zero, naming a
  rank of host 1 (bound: as the ranks');
* ``launcher-link`` (not by default) the same with host 1's cable pulled: how long until the
  first and the last (both) launchers exit non-zero (bound: the ranks' + the launchers' grace
  period + their beat timeout, GRACE_PERIOD + 3 s).

Latency is measured from the injection (``time.monotonic``, one clock for every namespace)
to each survivor's exception: "first" = the first survivor to raise, "last" = the last
(the job has stopped everywhere), median and worst over the trials. "named" counts trials in
which every survivor raised PeerLost / CollectiveTimeout / Aborted naming a rank across the
cut; "ok" those that also stayed within the bound (PYCOLL_SOCKET_DEAD_MS + a keepalive
interval + 9 s, docs/troubleshooting.md; 13 s at 3000 ms).

Needs root, ``ip`` and ``unshare``. Writes ``<--name>.json`` and ``<--name>.md`` (default
``multihost_faults``) into ``--out``::

    sudo .venv/bin/python benchmarks/multihost_faults.py                 # 20 trials of each case
    sudo .venv/bin/python benchmarks/multihost_faults.py --trials 5 --cases launcher,launcher-link
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from multihost.jobs import DEAD_MS, bound_seconds, fault_trial, launcher_trial  # noqa: E402

from pycoll.testing.hosts import NamespaceHosts, chosen_cases  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "out" / "multihost-faults"
LAYOUT = {"link-down": (2, 2), "host-kill": (2, 2), "partition": (4, 2), "launcher": (2, 2),
          "launcher-link": (2, 2)}


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    return (statistics.median(values), max(values)) if values else (None, None)


def run_case(case: str, trials: int, dead_ms: int, seed: int) -> dict:
    k, per_host = LAYOUT[case]
    bound = bound_seconds(dead_ms)
    if case == "launcher-link":
        from pycoll.launch.launcher import GRACE_PERIOD
        bound += 2 * GRACE_PERIOD + 3.0
    rng = random.Random(seed)
    first: list[float] = []
    last: list[float] = []
    named = ok = setups = 0
    failures = []
    kinds: dict[str, int] = {}
    details = []
    started = time.monotonic()
    with NamespaceHosts(k) as hosts:
        for t in range(trials):
            with tempfile.TemporaryDirectory(prefix="pycoll-mh-faults-") as tmp:
                if case == "launcher":
                    lt = launcher_trial(hosts, per_host, Path(tmp), dead_ms=dead_ms, wait=90.0)
                    lost = set(range(per_host, 2 * per_host))
                    problems = lt.problems(bound, lost)
                    if not lt.setup_error and lt.exit_code is not None:
                        first.append(lt.exited)
                        last.append(lt.exited)
                        # named: exit non-zero and the lost ranks named (time aside)
                        named += not [p for p in problems if "bound" not in p]
                    details.append({"exit_code": lt.exit_code, "exited_s": round(lt.exited, 3),
                                    "launcher": [ln for ln in lt.stderr.splitlines()
                                                 if ln.startswith("pycoll.run:")]})
                elif case == "launcher-link":
                    lt = launcher_trial(hosts, per_host, Path(tmp), case="link-down",
                                        dead_ms=dead_ms, wait=bound + 30.0)
                    times = [v[1] for v in lt.launchers.values()]
                    problems = [f"setup: {lt.setup_error}"] if lt.setup_error else []
                    if not problems:
                        if None in times:
                            problems.append(f"launchers still running: {lt.launchers}")
                        else:
                            first.append(min(times))     # type: ignore[type-var]
                            last.append(max(times))      # type: ignore[type-var]
                        own = [ln for ln in lt.stderr.splitlines()
                               if ln.startswith("pycoll.run:")]
                        good = (all(c not in (None, 0) for c, _ in lt.launchers.values())
                                and any(f"rank {r}" in ln for ln in own
                                        for r in range(per_host, 2 * per_host)))
                        named += good
                        if not good:
                            problems.append(f"exit codes {lt.launchers}; node 0 said {own}")
                        elif max(times) > bound:     # type: ignore[type-var]
                            problems.append(f"a launcher exited {max(times):.1f} s after the "
                                            f"fault (bound {bound:g} s)")
                    details.append({"launchers": {h: list(v) for h, v in lt.launchers.items()},
                                    "node0": [ln for ln in lt.stderr.splitlines()
                                              if ln.startswith("pycoll.run:")]})
                else:
                    for attempt in range(3):     # a job that did not start is no fault trial
                        out = Path(tmp) / f"attempt{attempt}"
                        out.mkdir()
                        ft = fault_trial(hosts, case, per_host, out, dead_ms=dead_ms, rng=rng)
                        if not ft.setup_error:
                            break
                        setups += 1
                        print(f"  {case} trial {t + 1}: setup failed, again: "
                              f"{ft.setup_error[-300:]}", flush=True)
                    problems = ft.problems(bound)
                    lat = ft.latencies()
                    for res in ft.results.values():
                        kinds[res["kind"]] = kinds.get(res["kind"], 0) + 1
                    details.append({r: {"latency_s": round(lat[r], 3) if r in lat else None,
                                        "kind": res["kind"], "named": res["named"],
                                        "message": res["message"].split("\n")[0][:300]}
                                    for r, res in sorted(ft.results.items())})
                    if not ft.setup_error and lat:
                        first.append(min(lat.values()))
                        if len(lat) == len(ft.survivors):
                            last.append(max(lat.values()))
                    named += not ft.setup_error and all(ft.named_ok(r) for r in ft.survivors)
            ok += not problems
            if problems:
                failures.append({"trial": t, "problems": problems})
            print(f"  {case} trial {t + 1}/{trials}: {'ok' if not problems else problems}",
                  flush=True)
    f_med, f_max = _stats(first)
    l_med, l_max = _stats(last)
    return {"case": case, "hosts": k, "ranks_per_host": per_host, "trials": trials,
            "ok": ok, "named": named, "bound_s": bound, "dead_ms": dead_ms,
            "first_median_s": f_med, "first_worst_s": f_max,
            "last_median_s": l_med, "last_worst_s": l_max,
            "errors": kinds, "setup_retries": setups, "seconds": time.monotonic() - started,
            "failures": failures,
            "trial_details": details}


def _f(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def table(rows: list[dict]) -> str:
    lines = ["| case | hosts x ranks | trials | all named | within bound | first median | "
             "first worst | last median | last worst | bound |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['hosts']} x {r['ranks_per_host']} | {r['trials']} | "
                     f"{r['named']}/{r['trials']} | {r['ok']}/{r['trials']} | "
                     f"{_f(r['first_median_s'])} | {_f(r['first_worst_s'])} | "
                     f"{_f(r['last_median_s'])} | {_f(r['last_worst_s'])} | "
                     f"{r['bound_s']:g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--cases", default="link-down,host-kill,partition",
                    help="comma-separated: link-down, host-kill, partition, launcher, "
                         "launcher-link")
    ap.add_argument("--dead-ms", type=int, default=DEAD_MS, help="PYCOLL_SOCKET_DEAD_MS")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="directory for the json and md")
    ap.add_argument("--name", default="multihost_faults", help="their file name, less suffix")
    args = ap.parse_args(argv)
    cases = chosen_cases(ap, args.cases, LAYOUT, "case")
    print(f"# faults across namespace hosts: {args.trials} trials per case, "
          f"PYCOLL_SOCKET_DEAD_MS={args.dead_ms}, bound {bound_seconds(args.dead_ms):g} s, "
          f"{os.cpu_count()} CPUs", flush=True)
    rows = []
    for i, case in enumerate(cases):
        rows.append(run_case(case, args.trials, args.dead_ms, args.seed + 1000 * i))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version(),
            "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])}
    (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                          indent=1))
    md = [f"# Faults across hosts ({meta['date']})", "",
          f"`python benchmarks/{meta['command']}` on {meta['cpus']} CPUs, kernel {meta['kernel']}, "
          f"Python {meta['python']}; namespace hosts (`pycoll.testing.hosts`), "
          f"PYCOLL_SOCKET_DEAD_MS={args.dead_ms}, collective deadline 60 s. Latency in seconds "
          "from the fault to a survivor's exception (first / last survivor to raise); "
          "launcher: from the kill to node 0's launcher's exit; launcher-link: from the pulled "
          "cable to the first / last launcher's exit.", "", table(rows), ""]
    for r in rows:
        if r["errors"]:
            md.append(f"* {r['case']}: survivors raised " + ", ".join(
                f"{k} x{n}" for k, n in sorted(r["errors"].items())))
    for r in rows:
        for fail in r["failures"]:
            md.append(f"* {r['case']} trial {fail['trial']}: "
                      + "; ".join(p[:400].replace("\n", " ") for p in fail["problems"]))
    (out / f"{args.name}.md").write_text("\n".join(md) + "\n")
    print(table(rows))
    print(f"wrote {out / args.name}.json and .md")
    return 0 if all(r["ok"] == r["trials"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
