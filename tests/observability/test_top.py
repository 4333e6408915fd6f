"""``pycoll top`` in a real terminal: tmux runs it against 8 real rank processes, and the test
reads the pane (``tmux capture-pane -p``) as a person would see it. Skips where tmux is absent.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import pytest

from .test_status import TOKEN, _all_done

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (apt-get install tmux): "
                                        "pycoll top is tested in a real terminal")]


class Pane:
    """One tmux server of its own (its own socket), one window running ``command``."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.socket = f"pycoll-top-{uuid.uuid4().hex[:8]}"
        # a session with no client attached has tmux's default size (80x24), whatever -x says
        self.conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
        self.conf.write("set -g default-size 150x30\n")
        self.conf.close()
        self.tmux = ["tmux", "-L", self.socket, "-f", self.conf.name]
        exports = [f"{k}={v}" for k, v in env.items()]
        subprocess.run(self.tmux + ["new-session", "-d", "-x", "150", "-y", "30",
                                    # curses believes COLUMNS and LINES over the terminal
                                    "env", "-u", "COLUMNS", "-u", "LINES", *exports,
                                    *command], check=True, timeout=30)

    def text(self) -> str:
        r = subprocess.run(self.tmux + ["capture-pane", "-p"], capture_output=True,
                           text=True, timeout=30)
        return r.stdout

    def wait_for(self, pred: Any, deadline: float = 120.0) -> str:
        end = time.monotonic() + deadline
        screen = ""
        while time.monotonic() < end:
            screen = self.text()
            if pred(screen):
                return screen
            time.sleep(0.3)
        raise AssertionError(f"the screen never showed it; last screen:\n{screen}")

    def alive(self) -> bool:
        return subprocess.run(self.tmux + ["has-session"], capture_output=True,
                              timeout=30).returncode == 0

    def close(self) -> None:
        subprocess.run(self.tmux + ["kill-server"], capture_output=True, timeout=30)
        os.unlink(self.conf.name)


def _top(address: str) -> Pane:
    env = {"PYCOLL_TOKEN": TOKEN, "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
           "TERM": "xterm-256color"}
    return Pane([sys.executable, "-m", "pycoll.top", address, "--interval", "0.5"], env)


def _row(screen: str, rank: int) -> str:
    return next(line for line in screen.splitlines()
                if line[6:10].strip() == str(rank) and line[4:6] == "  ")


def test_top_shows_the_stuck_rank_and_the_verdict(job: Any) -> None:
    j = job(SLEEPER=2)
    pane = _top(j.address)
    try:
        screen = pane.wait_for(lambda s: "hung: allreduce #51" in s)
        print(screen)
        assert "pycoll top" in screen and "world: 8 ranks" in screen, screen
        assert "hung: allreduce #51 on world: ranks 0,1,3,4,5,6,7 wait for rank 2 " \
               "(outside pycoll for" in screen, screen
        stuck = _row(screen, 2)
        assert stuck.startswith("HOLD") and "outside" in stuck \
            and "outside pycoll since allreduce #50" in stuck, stuck
        for rank in (0, 1, 3, 7):
            row = _row(screen, rank)
            assert row.startswith("WAIT") and "allreduce #51" in row \
                and "waits for 2" in row, row
        j.release.touch()          # the stuck rank goes on: the screen says the job runs
        pane.wait_for(lambda s: "running: 8 ranks answered" in s or "rank 0 dead" in s)
        _all_done(j.finish())
        subprocess.run(pane.tmux + ["send-keys", "q"], timeout=30)
        end = time.monotonic() + 60
        while pane.alive() and time.monotonic() < end:
            time.sleep(0.2)
        assert not pane.alive(), "q did not quit"
    finally:
        pane.close()


def test_top_marks_a_straggler(job: Any) -> None:
    j = job(SLOW=5, SLOW_FACTOR=1.2, STEP_S=0.03)
    pane = _top(j.address)
    try:
        screen = pane.wait_for(lambda s: "straggler: rank 5 arrives last in" in s)
        print(screen)
        assert _row(screen, 5).startswith("SLOW"), screen
        assert not any(_row(screen, r).startswith("SLOW") for r in (0, 1, 2, 3, 4, 6, 7))
        _all_done(j.finish())
    finally:
        pane.close()


def test_top_refuses_a_wrong_secret_and_needs_a_terminal(job: Any) -> None:
    j = job(2)
    r = subprocess.run([sys.executable, "-m", "pycoll.top", j.address],
                       env={**os.environ, "PYCOLL_TOKEN": TOKEN}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "needs a terminal" in r.stderr, r.stderr
    pane = Pane(["sh", "-c", f"{sys.executable} -m pycoll.top {j.address}; echo EXIT=$?; "
                 "sleep 60"], {"PYCOLL_TOKEN": "wrong",
                               "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                               "TERM": "xterm-256color"})
    try:
        screen = pane.wait_for(lambda s: "EXIT=" in s)
        assert "EXIT=2" in screen and "refused" in screen, screen
    finally:
        pane.close()
    _all_done(j.finish())
