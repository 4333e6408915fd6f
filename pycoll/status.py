"""``python -m pycoll.status HOST:PORT``: which rank holds a running job up, right now.

ADDRESS is the job's store (``PYCOLL_MASTER_ADDR:PYCOLL_MASTER_PORT``); the job secret comes
from ``PYCOLL_TOKEN`` as for ranks. The tool reads every rank's status address from the store
(``pycoll/<name>/status/<rank>``, published at init by ``comm/status.py``), asks all ranks at
once, and prints a row per rank and a verdict line (``--json``: one object; ``--watch``:
again every few seconds). No rank is paused: each answers from a thread of its own.

Stragglers: every rank's answer carries the start times of its recent collectives (the flight
recorder's, on that rank's monotonic clock). The tool puts them on its own clock, with each
rank's offset estimated from the query's round trip (NTP's way: the rank's clock at the answer
against the middle of the round trip; exactly 0 for a rank on the tool's own kernel, whose
monotonic clock is the tool's), and for each call every rank took part in, names the rank
that arrived last and by how much after the second-to-last (the time the others waited for
it alone). A rank that is last in most calls is a straggler (docs/observability.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from .comm.status import Refused, straggler_line, stragglers, survey

#: the fields every row of ``--json`` has (None where they do not apply)
ROW_FIELDS = ("rank", "host", "pid", "state", "collective", "seq", "waiting_s", "waiting_for",
              "last_completed_seq")
#: the wait after which ranks in a call waiting for others are called hung
HUNG_AFTER_S = 1.0


def _store(host: str, port: int, token: str | None, timeout: float) -> Any:
    from rendezvous import TCPStore
    return TCPStore(host, port, token=token, timeout=timeout)


def _verdict(rows: list[dict[str, Any]], hung_after: float) -> dict[str, Any] | None:
    """The call the job is stuck in and whom it waits for, or None."""
    inside = [r for r in rows if r["state"] == "in_collective" and not r.get("p2p")
              and r.get("seq") is not None]
    if not inside:
        return None
    seq = max(r["seq"] for r in inside)
    stuck = [r for r in inside if r["seq"] == seq]
    since = max((r.get("waiting_s") or 0.0) for r in stuck)
    behind = [r for r in rows if not (r["state"] == "in_collective"
                                      and (r.get("seq") or 0) >= seq)
              and not (r["state"] == "outside" and r.get("last_completed_seq", 0) >= seq)]
    if not behind or since < hung_after:
        return None
    return {"collective": stuck[0].get("collective"), "seq": seq,
            "communicator": stuck[0].get("communicator"),
            "waiting": [r["rank"] for r in stuck],
            "waiting_for": [r["rank"] for r in behind], "since_s": round(since, 3)}


def collect(address: str, *, name: str = "world", token: str | None = None,
            timeout: float = 2.0, hung_after: float = HUNG_AFTER_S) -> dict[str, Any]:
    """Every rank's state, the verdict and the stragglers, as ``--json`` prints them."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ADDRESS must be HOST:PORT, not {address!r}")
    host = host.strip("[]")
    if token is None:
        token = os.environ.get("PYCOLL_TOKEN")
    began = time.monotonic()
    store = _store(host, int(port), token, max(timeout, 5.0))
    try:
        size, rows = survey(store, name, token, timeout)
    finally:
        store.close()
    hung = _verdict(rows, hung_after)
    for row in rows:
        row["waiting_for"] = (hung["waiting_for"] if hung and row["rank"] in hung["waiting"]
                              else [])
        for key in ROW_FIELDS:          # every row has every field the issue promises
            row.setdefault(key, None)
    slow = stragglers(rows, size)
    for row in rows:
        row.pop("communicators", None)
    return {"address": address, "communicator": name, "size": size, "ranks": rows,
            "hung": hung, "stragglers": slow, "took_s": round(time.monotonic() - began, 3)}


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _first_line(text: str | None, limit: int = 110) -> str:
    """An error's first line, cut to fit a terminal row (``--json`` has it whole)."""
    line = (text or "").splitlines()[0] if text else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def verdict_line(report: dict[str, Any]) -> str:
    rows = {r["rank"]: r for r in report["ranks"]}
    hung = report["hung"]
    if hung is not None:
        why = []
        for rank in hung["waiting_for"]:
            r = rows[rank]
            if r["state"] == "outside" and r.get("after"):
                why.append(f"rank {rank} (outside pycoll for {_age(r.get('outside_s'))} since "
                           f"{r['after']['collective']} #{r['after']['seq']})")
            elif r["state"] == "in_collective":
                why.append(f"rank {rank} (in {r.get('collective')} #{r.get('seq')})")
            else:
                why.append(f"rank {rank} ({r['state']}: {r.get('reason') or r.get('error')})")
        waiting = ",".join(map(str, hung["waiting"]))
        plural = "s" if len(hung["waiting"]) > 1 else ""
        return (f"hung: {hung['collective']} #{hung['seq']} on {hung['communicator']}: "
                f"rank{plural} {waiting} wait{'' if plural else 's'} for {'; '.join(why)}")
    gone = [r for r in report["ranks"] if r["state"] in ("dead", "unreachable")]
    failed = [r for r in report["ranks"] if r["state"] == "failed"]
    if gone or failed:
        parts = [f"rank {r['rank']} {r['state']} ({_first_line(r.get('reason'))})" for r in gone]
        if failed:
            ranks = ",".join(str(r["rank"]) for r in failed)
            parts.append(f"rank{'s' if len(failed) > 1 else ''} {ranks} failed "
                         f"({_first_line(failed[0].get('error'))})")
        return "trouble: " + "; ".join(parts)
    calls = sum(r.get("calls_per_s") or 0.0 for r in report["ranks"]) / max(1, report["size"])
    return f"running: {report['size']} ranks answered, {calls:.0f} calls/s per rank"


def straggler_lines(report: dict[str, Any]) -> list[str]:
    return [straggler_line(s) for s in report["stragglers"]]


#: the column header of a row (``row_line``), as ``pycoll.status`` and ``pycoll.top`` print it
HEADER = (f"{'rank':>4}  {'host':<14} {'pid':>7}  {'state':<13} {'call':<16} {'for':>8}  "
          f"{'last':>6} {'calls/s':>8} {'MB/s':>8}  note")


def row_line(r: dict[str, Any]) -> str:
    """One rank's row: its state, the call it is in (or the one it came out of), for how long,
    its rates, and whom it waits for or why it does not answer."""
    call = "-"
    note = ""
    if r["state"] == "in_collective":
        call = f"{r.get('collective')} #{r.get('seq')}"
        waits = _age(r.get("waiting_s"))
        if r.get("waiting_for"):
            note = "waits for " + ",".join(map(str, r["waiting_for"]))
    elif r["state"] == "outside":
        waits = _age(r.get("outside_s"))
        if r.get("after"):
            note = f"outside pycoll since {r['after']['collective']} #{r['after']['seq']}"
    else:
        waits = "-"
        note = _first_line(r.get("reason") or r.get("error"))
    return (f"{r['rank']:>4}  {str(r.get('host') or '-')[:14]:<14} {str(r.get('pid') or '-'):>7}"
            f"  {r['state']:<13} {call[:16]:<16} {waits:>8}  "
            f"{str(r.get('last_completed_seq') or '-'):>6} {r.get('calls_per_s', 0.0) or 0.0:>8.0f}"
            f" {(r.get('bytes_per_s') or 0.0) / 1e6:>8.2f}  {note}")


def render(report: dict[str, Any]) -> str:
    lines = [HEADER] + [row_line(r) for r in report["ranks"]]
    lines.append(verdict_line(report))
    lines += straggler_lines(report)
    return "\n".join(lines)


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The options that name a job and how to ask it (``pycoll.status``, ``pycoll.top``)."""
    p.add_argument("address", metavar="HOST:PORT", help="the job's store "
                   "(PYCOLL_MASTER_ADDR:PYCOLL_MASTER_PORT)")
    p.add_argument("--name", default="world", help="the root communicator (default world)")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="seconds to wait for each rank's answer (default 2)")
    p.add_argument("--hung-after", type=float, default=HUNG_AFTER_S,
                   help="seconds a call must wait before the job counts as hung (default 1)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pycoll.status",
        description="Show every rank of a running pycoll job: in which call, for how long, "
                    "whom it waits for; who is hung, dead or a straggler. The job secret "
                    "comes from PYCOLL_TOKEN.")
    add_job_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--watch", nargs="?", type=float, const=2.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 2) until interrupted")
    args = p.parse_args(argv)
    from rendezvous import AuthError, StoreError
    while True:
        try:
            report = collect(args.address, name=args.name, timeout=args.timeout,
                             hung_after=args.hung_after)
        except (AuthError, Refused) as e:
            print(f"pycoll.status: refused: {e} (set PYCOLL_TOKEN to the job's secret)",
                  file=sys.stderr)
            return 2
        except (StoreError, OSError, ValueError, KeyError) as e:
            print(f"pycoll.status: cannot read the job at {args.address}: {e}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(report), flush=True)
        else:
            if args.watch:
                print("\x1b[H\x1b[2J", end="")
            print(render(report), flush=True)
        if not args.watch:
            return 0
        try:
            time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
