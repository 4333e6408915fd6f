"""How a rank ended, in the launcher's words and exit codes.

Shared by the supervisor (a failure ends the job) and the elastic policy (a failure may be
outlived), so that both name a rank's end the same way: ``exited with code 3``, ``was killed
by signal 9 (SIGKILL)``, and turn it into the same exit code (128 + signal number).
"""
from __future__ import annotations

import signal
import sys

__all__ = ["notice", "signal_name", "describe_exit", "exit_code"]

_PREFIX = "pycoll.run"


def notice(msg: str) -> None:
    """One line on the launcher's stderr, as ``pycoll.run: msg``."""
    try:
        sys.stderr.write(f"{_PREFIX}: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(returncode: int) -> str:
    """``Popen.returncode`` in words (negative: killed by that signal)."""
    if returncode < 0:
        return f"was killed by signal {-returncode} ({signal_name(-returncode)})"
    return f"exited with code {returncode}"


def exit_code(returncode: int) -> int:
    """The shell's exit status for ``Popen.returncode``: 128 + signal number if killed."""
    return 128 - returncode if returncode < 0 else returncode
