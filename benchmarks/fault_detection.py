"""Detection latency for a killed rank: how long until every survivor knows, and who.

For each case (transport x world size x message size) it runs ``--trials`` jobs; in each, the
ranks loop on an allreduce (``--collective``) and one random rank gets SIGKILL a random
20-150 ms after every rank finished its first collective. Latency is measured from the kill
to each survivor's exception (``time.monotonic``, one clock for every process on the host):

* first  - the first survivor to raise (a direct neighbour of the dead rank, usually),
* all    - the last survivor to raise (the job has fully stopped),

reported as median and worst over the trials. Every survivor must raise PeerLost or Aborted
naming the dead rank (the "named" column counts trials where all of them did). The
collective deadline is 60 s, so anything below a second is detection, not timeout.

    python benchmarks/fault_detection.py                      # 50 trials, tcp/shm x 2/4 x 8 B/8 MiB
    python benchmarks/fault_detection.py --trials 10 --worlds 8 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pycoll.testing.faults import kill_during  # noqa: E402


def _size(text: str) -> int:
    text = text.strip().upper()
    for suffix, mult in (("KIB", 1 << 10), ("MIB", 1 << 20), ("K", 1 << 10), ("M", 1 << 20),
                         ("B", 1)):
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * mult)
    return int(text)


def _fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else (f"{n >> 10} KiB" if n >= 1 << 10 else f"{n} B")


def run_case(transport: str, world: int, nbytes: int, collective: str, trials: int,
             seed: int, trace_dir: str) -> dict:
    first, last, named, failures = [], [], 0, []
    for t in range(trials):
        res = kill_during(world, collective, nbytes, transport=transport, seed=seed + t,
                          env={"PYCOLL_TRACE_DIR": trace_dir}, deadline=60.0, wait=30.0)
        lat = [s.latency for s in res.survivors]
        ok = all(s.kind in ("PeerLost", "Aborted") and
                 (f"rank {res.victim} is gone" in s.message or
                  f"peer rank {res.victim}" in s.message) for s in res.survivors)
        if None in lat or res.leaked_segments:
            failures.append({"trial": t, "victim": res.victim, "leaked": res.leaked_segments,
                             "survivors": [(s.rank, s.kind, s.message[:200])
                                           for s in res.survivors]})
            continue
        named += ok
        first.append(min(lat))   # type: ignore[type-var]
        last.append(max(lat))    # type: ignore[type-var]
    return {"transport": transport, "world": world, "nbytes": nbytes, "collective": collective,
            "trials": trials, "ok_trials": len(last), "named": named,
            "first_median_ms": 1e3 * statistics.median(first) if first else None,
            "first_worst_ms": 1e3 * max(first) if first else None,
            "all_median_ms": 1e3 * statistics.median(last) if last else None,
            "all_worst_ms": 1e3 * max(last) if last else None,
            "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes", default="8,8MiB", help="message sizes (8, 64KiB, 8MiB, ...)")
    ap.add_argument("--collective", default="allreduce", choices=["allreduce", "broadcast"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args(argv)
    trace_dir = tempfile.mkdtemp(prefix="pycoll-fault-bench-")
    rows = []
    print(f"# pycoll kill -9 detection latency: {args.collective}, {args.trials} trials per "
          f"case, collective deadline 60 s, {os.cpu_count()} CPUs")
    print(f"# {'transport':<9} {'world':>5} {'size':>8} {'ok':>6} {'named':>6} "
          f"{'first med':>10} {'first max':>10} {'all med':>9} {'all max':>9}   (ms)")
    for transport in args.transports.split(","):
        for world in (int(w) for w in args.worlds.split(",")):
            for nbytes in (_size(s) for s in args.sizes.split(",")):
                t0 = time.time()
                row = run_case(transport, world, nbytes, args.collective, args.trials,
                               args.seed, trace_dir)
                rows.append(row)

                def f(v):
                    return f"{v:.0f}" if v is not None else "-"
                print(f"  {transport:<9} {world:>5} {_fmt_size(nbytes):>8} "
                      f"{row['ok_trials']:>3}/{row['trials']:<2} {row['named']:>6} "
                      f"{f(row['first_median_ms']):>10} {f(row['first_worst_ms']):>10} "
                      f"{f(row['all_median_ms']):>9} {f(row['all_worst_ms']):>9}"
                      f"   [{time.time() - t0:.0f} s]", flush=True)
                for fail in row["failures"]:
                    print(f"    FAILED trial: {fail}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all(not r["failures"] and r["named"] == r["trials"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
