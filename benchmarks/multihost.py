"""Many hosts on one machine: tcp between network-namespace hosts with shaped links.

Three measurements, all in one run on the same namespaces (``pycoll.testing.hosts``), every
host's outgoing link shaped to ``--rate`` (tc tbf):

* ``link``: the link's one-way TCP throughput, host 0 -> host 1 (one plain socket stream of
  ``--link-bytes``, median of 3): the ceiling for what a collective can get between hosts;
* ``nsocks``: allreduce between 2 hosts x 1 rank with 1, 2 and 4 sockets per peer
  (``PYCOLL_SOCKET_NSOCKS``), busbw against the link;
* ``hier``: allreduce on 4 hosts x 2 ranks, flat ``ring`` vs ``hierarchical`` vs the automatic
  choice (links measured at init), with ranks placed in blocks (ranks 0-1 on host 0, ...) and
  round-robin (rank r on host r % 4: Slurm's ``--distribution=cyclic``).

    python benchmarks/multihost.py --rate 2gbit --out benchmarks/out/multihost

Needs root, iproute2 (ip, tc) and unshare; writes results.json and results.md to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pycoll.testing import free_port  # noqa: E402
from pycoll.testing.hosts import NamespaceHosts, available  # noqa: E402

RECEIVER = r"""
import socket, sys, time
total = int(sys.argv[2])
srv = socket.create_server((sys.argv[1], 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = bytearray(1 << 20)
got = conn.recv_into(buf)
start = time.perf_counter()
while got < total:
    n = conn.recv_into(buf)
    if not n:
        break
    got += n
print(got / (time.perf_counter() - start), flush=True)
"""

SENDER = r"""
import socket, sys
total = int(sys.argv[3])
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
chunk = b"\0" * (1 << 20)
sent = 0
while sent < total:
    s.sendall(chunk)
    sent += len(chunk)
s.close()
"""


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCOLL_", "MASTER_", "SLURM_", "OMPI_", "PMI"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return env


def link_throughput(hosts: NamespaceHosts, nbytes: int) -> float:
    """One-way TCP bytes/s from host 0 to host 1 (one socket)."""
    rx = hosts.popen(1, [sys.executable, "-c", RECEIVER, hosts.addresses[1], str(nbytes)],
                     env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        port = rx.stdout.readline().strip()  # type: ignore[union-attr]
        hosts.run(0, [sys.executable, "-c", SENDER, hosts.addresses[1], port, str(nbytes)],
                  env=_env(), timeout=300, check=True)
        out, _ = rx.communicate(timeout=60)
        return float(out.strip().splitlines()[-1])
    finally:
        if rx.poll() is None:
            os.killpg(rx.pid, signal.SIGKILL)
            rx.wait(10)


def bench_job(hosts: NamespaceHosts, world: int, host_of: list[int], bench_args: list[str],
              extra_env: dict[str, str], timeout: float = 600) -> dict:
    """``python -m pycoll.bench`` on ``world`` ranks, rank r on host ``host_of[r]``; the
    JSON rank 0 wrote."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        procs = []
        local_counts: dict[int, int] = {}
        per_host = world // hosts.k if world >= hosts.k else 1
        try:
            for r in range(world):
                h = host_of[r]
                local = local_counts.get(h, 0)
                local_counts[h] = local + 1
                env = _env(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                           LOCAL_WORLD_SIZE=str(per_host), MASTER_ADDR=hosts.addresses[0],
                           MASTER_PORT=str(port), PYCOLL_TOKEN="multihost-bench",
                           **extra_env)
                argv = [sys.executable, "-m", "pycoll.bench", *bench_args, "-q"]
                if r == 0:
                    argv += ["--json", out]
                procs.append(hosts.popen(h, argv, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True))
            outs = [p.communicate(timeout=timeout)[0] for p in procs]
            for p, o in zip(procs, outs):
                if p.returncode != 0:
                    raise RuntimeError(f"bench rank failed ({p.returncode}): {o[-3000:]}")
            with open(out) as f:
                return json.load(f)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)


def busbw(result: dict) -> dict[int, float]:
    return {row["size"]: row["busbw_GBps"] for row in result["results"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="2gbit", help="every host's outgoing link (tc tbf)")
    ap.add_argument("--link-bytes", type=int, default=512 << 20)
    ap.add_argument("--sizes", default="1M:64M", help="allreduce sizes (pycoll.bench -m)")
    ap.add_argument("--budget", default="4", help="seconds per size (pycoll.bench)")
    ap.add_argument("--parts", default="link,nsocks,hier")
    ap.add_argument("--out", required=True)
    ap.add_argument("--render", action="store_true",
                    help="only rewrite results.md from --out's results.json")
    args = ap.parse_args(argv)
    if args.render:
        with open(os.path.join(args.out, "results.json")) as f:
            report = json.load(f)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(render(report, report.get("command", "python benchmarks/multihost.py")))
        return 0
    ok, why = available()
    if not ok:
        print(f"cannot create namespace hosts: {why}", file=sys.stderr)
        return 2
    parts = set(args.parts.split(","))
    os.makedirs(args.out, exist_ok=True)
    command = " ".join(["python", "benchmarks/multihost.py", *(argv or sys.argv[1:])])
    report: dict = {"rate": args.rate, "sizes": args.sizes, "date": time.strftime("%F %T"),
                    "command": command}
    common = ["allreduce", "-m", args.sizes, "--time-budget", args.budget,
              "--min-iterations", "3", "-x", "1"]
    with NamespaceHosts(4, rate=args.rate) as hosts:
        if "link" in parts:
            runs = [link_throughput(hosts, args.link_bytes) for _ in range(3)]
            report["link_Bps"] = {"median": statistics.median(runs), "runs": runs}
            print(f"link {args.rate}: one-way TCP {statistics.median(runs) / 1e9:.3f} GB/s "
                  f"({', '.join(f'{r / 1e9:.3f}' for r in runs)})", flush=True)
        if "nsocks" in parts:
            report["nsocks"] = {}
            for n in (1, 2, 4):
                res = bench_job(hosts, 2, [0, 1], common,
                                {"PYCOLL_SOCKET_NSOCKS": str(n)})
                report["nsocks"][n] = busbw(res)
                print(f"2 hosts x 1 rank, {n} socket(s) per peer: " + ", ".join(
                    f"{_size(b)} {v:.3f}" for b, v in busbw(res).items()), flush=True)
        if "hier" in parts:
            report["hier"] = {}
            placements = {"block": [r // 2 for r in range(8)], "cyclic": [r % 4 for r in range(8)]}
            for place, host_of in placements.items():
                for algo in ("ring", "hierarchical", "auto"):
                    extra = [] if algo == "auto" else ["-A", algo]
                    res = bench_job(hosts, 8, host_of, common + extra, {})
                    rows = {row["size"]: {"busbw": row["busbw_GBps"],
                                           "algorithm": row.get("algorithm")}
                            for row in res["results"]}
                    report["hier"][f"{place}/{algo}"] = rows
                    print(f"4 hosts x 2 ranks, {place}, {algo}: " + ", ".join(
                        f"{_size(b)} {v['busbw']:.3f} ({v['algorithm']})"
                        for b, v in rows.items()), flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(render(report, command))
    return 0


def _size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def render(report: dict, command: str) -> str:
    lines = [f"# Many hosts on one machine: shaped links ({report['rate']} per host)", "",
             f"`{command}` on {report['date']}. busbw in GB/s (nccl-tests' definition).", ""]
    link = report.get("link_Bps", {}).get("median")
    if link:
        lines += [f"One-way TCP throughput of a link (one socket, median of 3): "
                  f"**{link / 1e9:.3f} GB/s**.", ""]
    if "nsocks" in report:
        sizes = sorted({int(b) for v in report["nsocks"].values() for b in v})
        lines += ["## 2 hosts x 1 rank: sockets per peer", "",
                  "| size | " + " | ".join(f"{n} socket(s)" for n in report["nsocks"]) +
                  (" | best / link |" if link else " |"),
                  "|---|" + "---|" * (len(report["nsocks"]) + (1 if link else 0))]
        for b in sizes:
            vals = [report["nsocks"][n].get(b) or report["nsocks"][n].get(str(b))
                    for n in report["nsocks"]]
            row = f"| {_size(b)} | " + " | ".join(f"{v:.3f}" for v in vals)
            if link:
                row += f" | {max(vals) * 1e9 / link:.2f}"
            lines.append(row + " |")
        lines.append("")
    if "hier" in report:
        lines += ["## 4 hosts x 2 ranks: flat ring, hierarchical, automatic choice", ""]
        for place in ("block", "cyclic"):
            cases = {k.split("/")[1]: v for k, v in report["hier"].items()
                     if k.startswith(place + "/")}
            if not cases:
                continue
            sizes = sorted({int(b) for v in cases.values() for b in v})
            lines += [f"### {place} placement", "",
                      "| size | ring | hierarchical | hier / ring | auto (chose) | auto / best |",
                      "|---|---|---|---|---|---|"]
            for b in sizes:
                def get(algo, cases=cases, b=b):
                    return cases[algo].get(b) or cases[algo].get(str(b))

                ring, hier, auto = get("ring"), get("hierarchical"), get("auto")
                best = max(ring["busbw"], hier["busbw"])
                lines.append(f"| {_size(b)} | {ring['busbw']:.3f} | {hier['busbw']:.3f} | "
                             f"{hier['busbw'] / ring['busbw']:.2f} | {auto['busbw']:.3f} "
                             f"({auto['algorithm']}) | {auto['busbw'] / best:.2f} |")
            lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
