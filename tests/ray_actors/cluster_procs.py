"""Finding the processes of a Ray cluster a test started, to prove none outlives it.

The test puts ``TAG=<a fresh uuid>`` in the environment of the processes it starts (the
driver that runs ``ray.init``, or ``ray start``); every process of that cluster (GCS, raylet,
agents, workers) inherits it. Nothing here kills anything: the tests stop what they started.
"""
from __future__ import annotations

import os
import time

TAG = "PYCOLL_RAY_TEST_CLUSTER"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def tagged_processes(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries ``TAG=tag``."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if _alive(int(entry)):
            found.append(int(entry))
    return found


def wait_gone(pids: list[int], limit: float) -> list[int]:
    """The ``pids`` still alive after up to ``limit`` seconds."""
    deadline = time.monotonic() + limit
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _alive(p)]
    return alive
