"""``python -m pycoll.top HOST:PORT`` (``pycoll-top``): a live view of a running job.

A row per rank (state, the call it is in or came out of, for how long, calls/s and MB/s),
refreshed every second, with the verdict and the stragglers below. What it shows is
``pycoll.status``'s survey (``pycoll.status.collect``): the same answers, the same verdict,
asked the same way (PYCOLL_TOKEN is the job's secret); this module only draws them.

Plain curses, so it works over ssh in any terminal with a terminfo entry. The marks in the
first column say in words what the colours say, so a screen without colours (or its copy
in a bug report) still shows them: HOLD (the rank the hung call waits for: red), WAIT (a
rank in that call), SLOW (a straggler: yellow), DEAD / GONE / FAIL (dead, unreachable or
failed: red). ``q`` quits.
"""
from __future__ import annotations

import argparse
import curses
import sys
import textwrap
import time
from typing import Any

from .comm.status import Refused
from .status import (
    HEADER,
    add_job_arguments,
    collect,
    row_line,
    straggler_lines,
    verdict_line,
)

#: how each kind of line is drawn: (colour, attributes)
_STYLE = {"hold": (curses.COLOR_RED, curses.A_BOLD | curses.A_REVERSE),
          "gone": (curses.COLOR_RED, curses.A_BOLD),
          "slow": (curses.COLOR_YELLOW, curses.A_BOLD),
          "wait": (-1, 0), "ok": (curses.COLOR_GREEN, 0), "head": (-1, curses.A_BOLD),
          "": (-1, 0)}
_GONE = {"dead": "DEAD", "unreachable": "GONE", "failed": "FAIL"}


def mark(row: dict[str, Any], report: dict[str, Any]) -> tuple[str, str]:
    """A row's mark (what it says in words) and style (what its colour says)."""
    hung = report.get("hung")
    if hung is not None and row["rank"] in hung["waiting_for"]:
        return "HOLD", "hold"
    if row["state"] in _GONE:
        return _GONE[row["state"]], "gone"
    if any(s["rank"] == row["rank"] for s in report.get("stragglers", ())):
        return "SLOW", "slow"
    if hung is not None and row["rank"] in hung["waiting"]:
        return "WAIT", "wait"
    return "", ""


def screen(report: dict[str, Any] | None, problem: str | None, address: str,
           height: int, width: int) -> list[tuple[str, str]]:
    """The lines of one screen with their styles, ``height`` lines at most. The verdict and
    the stragglers wrap (they are what a person reads first; rows are cut at the edge), and
    the marked rows come first when not every row fits, so the ranks that matter are never
    scrolled away."""
    now = time.strftime("%H:%M:%S")
    if report is None:
        head = f"pycoll top  {address}  {now}  asking..."
        return [(head, "head")] + ([(problem, "gone")] if problem else [])
    head = (f"pycoll top  {address}  {report['communicator']}: {report['size']} ranks  "
            f"asked in {report['took_s']:.2f} s  {now}  (q quits)")
    rows = [(mark(r, report), r) for r in report["ranks"]]
    verdict = verdict_line(report)
    said = [(verdict, "hold" if report["hung"] else "ok" if verdict.startswith("running")
             else "gone")]
    said += [(line, "slow") for line in straggler_lines(report)]
    if problem:
        said.append((f"stale: {problem}", "gone"))
    tail = [(part, style) for text, style in said
            for part in textwrap.wrap(text, max(width - 1, 20), subsequent_indent="  ")]
    room = height - 3 - len(tail)
    if len(rows) > room:
        rows.sort(key=lambda x: (not x[0][0], x[1]["rank"]))
        hidden = len(rows) - max(room - 1, 0)
        rows = rows[:max(room - 1, 0)]
        tail.insert(0, (f"... {hidden} more rows (unmarked): enlarge the terminal", ""))
    lines = [(head, "head"), ("", ""), (f"{'':4}  {HEADER}", "head")]
    lines += [(f"{m:4}  {row_line(r)}", style) for (m, style), r in rows]
    return (lines + tail)[:height]


class _Quit(Exception):
    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code


def _run(scr: Any, args: argparse.Namespace) -> int:
    from rendezvous import AuthError, StoreError
    try:
        curses.curs_set(0)
    except curses.error:          # a terminal that cannot hide the cursor still works
        pass
    colours: dict[str, int] = {}
    if curses.has_colors():
        curses.start_color()
        curses.use_default_colors()
        for i, (style, (fg, _)) in enumerate(_STYLE.items(), 1):
            curses.init_pair(i, fg, -1)
            colours[style] = curses.color_pair(i)
    scr.timeout(int(args.interval * 1000))
    report: dict[str, Any] | None = None
    problem: str | None = None
    while True:
        try:
            report = collect(args.address, name=args.name, timeout=args.timeout,
                             hung_after=args.hung_after)
            problem = None
        except (AuthError, Refused) as e:
            raise _Quit(2, f"pycoll.top: refused: {e} "
                           "(set PYCOLL_TOKEN to the job's secret)") from None
        except (StoreError, OSError, ValueError, KeyError) as e:
            # the job may be gone or the store busy: keep the last screen, say it is stale
            problem = f"cannot read the job at {args.address}: {e}"
        height, width = scr.getmaxyx()
        scr.erase()
        for y, (text, style) in enumerate(screen(report, problem, args.address, height,
                                                  width)):
            try:
                scr.addnstr(y, 0, text, width - 1,
                            colours.get(style, 0) | _STYLE.get(style, (-1, 0))[1])
            except curses.error:   # the last cell of the screen: nothing lost but a blank
                pass
        scr.refresh()
        key = scr.getch()
        if key in (ord("q"), ord("Q"), 27):
            return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pycoll.top",
        description="A live view of a running pycoll job: a row per rank, the hung and the "
                    "slow highlighted (q quits). The job secret comes from PYCOLL_TOKEN. "
                    "Without a terminal, use python -m pycoll.status --watch.")
    add_job_arguments(p)
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between refreshes (default 1)")
    args = p.parse_args(argv)
    if not sys.stdout.isatty():
        print("pycoll.top: needs a terminal; use python -m pycoll.status --watch",
              file=sys.stderr)
        return 2
    try:
        return int(curses.wrapper(_run, args))
    except _Quit as e:
        print(e, file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
