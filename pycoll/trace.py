"""Merge flight-recorder dumps from several ranks and say who is behind or stuck where.

    python -m pycoll.trace /tmp/pycoll-traces-1000/pycoll-trace-<job>-world-rank*.json
    python -m pycoll.trace DIR            # every dump in DIR, grouped by job and communicator
    python -m pycoll.trace --json FILES   # the verdicts as JSON

For each communicator it finds the earliest collective that some rank did not complete, and
classifies every rank against it: waiting in it (and for whom), never started it (behind:
its last completed collective), started it late (after the others gave up), already past it,
or left no dump. Then one verdict line, e.g.::

    rank 2 never started allreduce #17; ranks 0,1,3 are waiting in it.

The sequence numbers are each communicator's own operation counters (``allreduce #17`` is the
17th operation on that communicator on that rank), as in every pycoll error message.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from .runtime.flight_recorder import FORMAT


def load(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Read every flight-recorder dump among ``paths`` (files, directories or globs)."""
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            files.extend(sorted(glob.glob(os.path.join(p, "*.json"))))
        elif any(c in p for c in "*?["):
            files.extend(sorted(glob.glob(p)))
        else:
            files.append(p)
    docs = []
    for f in files:
        try:
            with open(f) as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"pycoll.trace: skipping {f}: {e}", file=sys.stderr)
            continue
        if isinstance(doc, dict) and doc.get("format") == FORMAT:
            doc["_file"] = f
            docs.append(doc)
    return docs


def _ranks(rs: Sequence[int]) -> str:
    rs = sorted(rs)
    return f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}"


def _op(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "nothing"
    return f"{entry['collective']} #{entry['seq']}"


def _call(entry: dict[str, Any]) -> str:
    args = [f"{k}={entry[k]}" for k in ("dtype", "count", "op", "root", "algorithm")
            if entry.get(k) is not None]
    args.append(f"{entry.get('nbytes')} bytes")
    return f"{entry['collective']}({', '.join(args)})"


class RankView:
    """One rank's dump, reduced to what the analysis needs."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.rank = int(doc["rank"])
        # Point-to-point calls have their own counter (only some ranks take part): the
        # cross-rank comparison is about collectives, which every rank numbers alike.
        self.entries = sorted((e for e in doc.get("entries", [])
                               if e["collective"] not in ("send", "recv", "batch_p2p")),
                              key=lambda e: e["seq"])
        self.by_seq = {e["seq"]: e for e in self.entries}
        done = [e["seq"] for e in self.entries if e["state"] == "completed"]
        self.last_completed = max(done) if done else None
        self.last_completed_entry = self.by_seq.get(self.last_completed) if done else None
        self.frontier = next((e for e in self.entries if e["state"] != "completed"), None)
        self.first_seq = self.entries[0]["seq"] if self.entries else None

    def has_completed(self, seq: int) -> bool:
        e = self.by_seq.get(seq)
        if e is not None:
            return e["state"] == "completed"
        # older than the ring holds, and something later completed: it completed too
        return self.first_seq is not None and seq < self.first_seq


def analyze(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per (job, communicator): per-rank status lines and a verdict."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for d in docs:
        groups.setdefault((d.get("job"), d.get("communicator")), []).append(d)
    reports = []
    for (job, comm), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        latest: dict[int, dict[str, Any]] = {}
        for d in group:  # one dump per rank: the latest
            r = int(d["rank"])
            if r not in latest or d.get("dumped_at", 0) > latest[r].get("dumped_at", 0):
                latest[r] = d
        reports.append(_analyze_group(job, comm, [RankView(d) for _, d in sorted(latest.items())]))
    return reports


def _first_line(text: Any) -> str:
    return str(text or "").strip().splitlines()[0] if text else ""


def _analyze_group(job: Any, comm: Any, views: list[RankView]) -> dict[str, Any]:
    size = max(int(v.doc.get("world_size", 0)) for v in views)
    present = {v.rank for v in views}
    missing = sorted(set(range(size)) - present)
    lines: list[str] = []
    verdict: list[str] = []
    dropped = {v.rank: v.doc.get("dropped", 0) for v in views if v.doc.get("dropped")}
    abort = next((v.doc.get("abort_record") for v in views if v.doc.get("abort_record")), None)

    frontiers = [v.frontier for v in views if v.frontier is not None]
    focus = min(frontiers, key=lambda e: e["seq"]) if frontiers else None
    waiting: list[int] = []
    behind: list[int] = []
    late: list[int] = []
    ahead: list[int] = []
    kinds: dict[tuple, list[int]] = {}
    waits_for: dict[int, list[int]] = {}
    seq: int = focus["seq"] if focus is not None else -1
    gave_up_at = t0 = None
    if focus is not None:
        here = [v.by_seq[seq] for v in views if seq in v.by_seq]
        gave_up = [e["ended_at"] for e in here if e["state"] == "failed" and e.get("ended_at")]
        gave_up_at = min(gave_up) if gave_up else None
        started = [e["started_at"] for e in here if e.get("started_at")]
        t0 = min(started) if started else None
    for v in views:
        head = f"rank {v.rank} (host {v.doc.get('host')}, pid {v.doc.get('pid')})"
        status = f"last completed {_op(v.last_completed_entry)}"
        if focus is None:
            lines.append(f"{head}: {status}; nothing in flight")
            continue
        e = v.by_seq.get(seq)
        if e is not None:
            kinds.setdefault((e["collective"], e.get("nbytes")), []).append(v.rank)
        if e is None or e["state"] == "scheduled":
            if v.has_completed(seq):
                ahead.append(v.rank)
                lines.append(f"{head}: {status}; already past #{seq}")
            else:
                behind.append(v.rank)
                lines.append(f"{head}: {status}; never started #{seq}"
                             + (" (it was queued)" if e is not None else ""))
            continue
        rel = f" at +{e['started_at'] - t0:.3f} s" if t0 is not None and e.get("started_at") else ""
        error = f"; error: {_first_line(e.get('error'))}" if e.get("error") else ""
        if gave_up_at is not None and e.get("started_at") and e["started_at"] > gave_up_at:
            late.append(v.rank)
            lines.append(f"{head}: started {_op(e)}{rel}, {e['started_at'] - gave_up_at:.3f} s "
                         f"after another rank had given up on it; {e['state']}{error}")
            continue
        if e["state"] == "completed":
            ahead.append(v.rank)
            lines.append(f"{head}: completed {_op(e)}{rel}; now at {_op(v.frontier)}")
            continue
        waiting.append(v.rank)
        pend = e.get("pending_peers")
        if pend:
            waits_for[v.rank] = list(pend)
        what = f"waiting for peer rank(s) {pend}" if pend else "in it"
        dur = e.get("duration_s") or e.get("running_for_s")
        lines.append(f"{head}: {status}; {e['state']} {_call(e)}{rel}, {what}"
                     + (f", for {dur:.3f} s" if dur else "") + error)
    for r in missing:
        lines.append(f"rank {r}: no dump (it never failed inside pycoll: hung outside a "
                     "collective, killed, or its dump is elsewhere)")
    if focus is not None:
        name = _op(focus)
        if len({c for c, _ in kinds}) > 1 or len({n for _, n in kinds}) > 1:
            said = "; ".join(f"{_ranks(rs)} called {c} ({n} bytes)"
                             for (c, n), rs in kinds.items())
            verdict.append(f"ranks disagree on what #{seq} is: {said}")
        if behind or missing:
            parts = []
            if behind:
                parts.append(f"{_ranks(behind)} never started {name}")
            if missing:
                parts.append(f"{_ranks(missing)} left no dump: never started {name} (hung "
                             "outside pycoll) or died")
            stuck = sorted(waiting + late)
            tail = (f"; {_ranks(stuck)} {'are' if len(stuck) > 1 else 'is'} waiting in it"
                    if stuck else "")
            verdict.append("; ".join(parts) + tail + ".")
        elif late:
            verdict.append(f"{_ranks(late)} {'were' if len(late) > 1 else 'was'} behind: "
                           f"reached {name} only after {_ranks(sorted(waiting))} had given up "
                           "waiting in it.")
        elif waiting:
            verdict.append(f"every rank reached {name}; {_ranks(waiting)} failed in it.")
        blamed: dict[int, list[int]] = {}
        for r, peers in waits_for.items():
            for p in peers:
                if p not in waiting:
                    blamed.setdefault(p, []).append(r)
        for p, rs in sorted(blamed.items()):
            verdict.append(f"{_ranks(rs)} {'were' if len(rs) > 1 else 'was'} waiting for rank "
                           f"{p} in {name}.")
    else:
        verdict.append("every recorded collective completed on every rank that left a dump"
                       + (f"; no dump from {_ranks(missing)}" if missing else "") + ".")
    if abort:
        from .runtime.abort import describe_record
        verdict.append(f"first failure (abort record): {_first_line(describe_record(abort))}")
    elif focus is not None:
        first = _first_failure(views, seq)
        if first:
            verdict.append(f"first failure: {first}")
    if dropped:
        verdict.append("older records were dropped (ring full): "
                       + ", ".join(f"rank {r}: {n}" for r, n in sorted(dropped.items())))
    return {"job": job, "communicator": comm, "world_size": size, "ranks": sorted(present),
            "missing": missing, "focus": _op(focus) if focus else None,
            "waiting": sorted(waiting), "never_started": sorted(behind), "late": sorted(late),
            "ahead": sorted(ahead), "waits_for": waits_for, "lines": lines, "verdict": verdict}


def _first_failure(views: list[RankView], seq: int) -> str | None:
    fails = []
    for v in views:
        e = v.by_seq.get(seq)
        if e and e["state"] == "failed" and not str(e.get("error", "")).startswith("Aborted"):
            fails.append((e.get("ended_at") or 0, v.rank, e.get("error", "")))
    if not fails:
        return None
    _, rank, err = min(fails)
    return f"rank {rank}: {_first_line(err)}"


def render(reports: list[dict[str, Any]]) -> str:
    out = []
    for rep in reports:
        out.append(f"communicator {rep['communicator']!r} (job {rep['job']}), world size "
                   f"{rep['world_size']}: dumps from {_ranks(rep['ranks'])}"
                   + (f", none from {_ranks(rep['missing'])}" if rep["missing"] else ""))
        out.extend(f"  {line}" for line in rep["lines"])
        out.extend(f"=> {v}" for v in rep["verdict"])
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pycoll.trace", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", help="dump files, directories or glob patterns")
    ap.add_argument("--json", action="store_true", help="print the analysis as JSON")
    args = ap.parse_args(argv)
    docs = load(args.paths)
    if not docs:
        print("pycoll.trace: no flight-recorder dumps found in " + " ".join(args.paths),
              file=sys.stderr)
        return 2
    reports = analyze(docs)
    if args.json:
        print(json.dumps(reports, indent=1))
    else:
        print(render(reports), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
