"""What TLS costs: allreduce busbw between two network-namespace hosts, with and without TLS.

Two hosts x 1 rank (tcp between them over an unshaped veth link, so the link is not the
limit and the cipher's cost shows), ``python -m pycoll.bench allreduce`` over ``--sizes``,
the plain job and the TLS job (``PYCOLL_TLS_CERT/KEY/CA``, certificates made for the run
with ``openssl``) interleaved ``--reps`` times in one run, so both see the same machine load.

    python benchmarks/experiments/tls_cost.py --out benchmarks/out/NAME

Needs root, iproute2 and openssl; writes results.json and results.md to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from multihost import _size, bench_job, busbw  # noqa: E402

from pycoll.testing.certs import make_job_certificates, openssl_available  # noqa: E402
from pycoll.testing.hosts import NamespaceHosts, available  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M:256M", help="allreduce sizes (pycoll.bench -m)")
    ap.add_argument("--budget", default="2", help="seconds per size (pycoll.bench)")
    ap.add_argument("--reps", type=int, default=3, help="plain/TLS pairs, interleaved")
    ap.add_argument("--nsocks", default="1", help="PYCOLL_SOCKET_NSOCKS of both jobs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    ok, why = available()
    if not ok or not openssl_available():
        print(f"cannot run: {why or 'no openssl command'}", file=sys.stderr)
        return 2
    command = " ".join(["python", "benchmarks/experiments/tls_cost.py", *(argv or sys.argv[1:])])
    common = ["allreduce", "-m", args.sizes, "--time-budget", args.budget,
              "--min-iterations", "3", "-x", "1"]
    runs: dict[str, list[dict[int, float]]] = {"plain": [], "tls": []}
    with tempfile.TemporaryDirectory() as tmp, NamespaceHosts(2) as hosts:
        certs = make_job_certificates(Path(tmp), ["rank"])["rank"]
        for rep in range(args.reps):
            order = ("plain", "tls") if rep % 2 == 0 else ("tls", "plain")
            for mode in order:
                env = {"PYCOLL_SOCKET_NSOCKS": args.nsocks, "PYCOLL_TRANSPORTS": "tcp",
                       **(certs if mode == "tls" else {})}
                res = busbw(bench_job(hosts, 2, [0, 1], common, env))
                runs[mode].append(res)
                print(f"rep {rep} {mode:5s}: " + ", ".join(
                    f"{_size(b)} {v:.3f}" for b, v in res.items()), flush=True)
    sizes = sorted(runs["plain"][0])
    table = {b: {mode: statistics.median(r[b] for r in runs[mode]) for mode in runs}
             for b in sizes}
    report = {"command": command, "date": time.strftime("%F %T"), "nsocks": args.nsocks,
              "runs": {m: [{str(k): v for k, v in r.items()} for r in rs]
                       for m, rs in runs.items()},
              "median": {str(b): row for b, row in table.items()}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(render(report, table, runs))
    print(render(report, table, runs))
    return 0


def render(report: dict, table: dict[int, dict[str, float]],
           runs: dict[str, list[dict[int, float]]]) -> str:
    lines = ["# TLS cost: allreduce between 2 namespace hosts, plain against TLS 1.3", "",
             f"`{report['command']}` on {report['date']}: 2 hosts x 1 rank, tcp over an "
             f"unshaped veth pair, {report['nsocks']} socket(s) per peer, "
             f"{len(runs['plain'])} plain and {len(runs['tls'])} TLS jobs interleaved. "
             "busbw in GB/s (nccl-tests' definition), median of the jobs; every job's "
             "numbers in results.json.", "",
             "| size | plain | TLS | TLS / plain | plain, each job | TLS, each job |",
             "|---|---|---|---|---|---|"]
    for b, row in table.items():
        each = {m: ", ".join(f"{r[b]:.3f}" for r in runs[m]) for m in runs}
        lines.append(f"| {_size(b)} | {row['plain']:.3f} | {row['tls']:.3f} | "
                     f"{row['tls'] / row['plain']:.2f} | {each['plain']} | {each['tls']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
