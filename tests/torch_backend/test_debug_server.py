"""pycoll's handler on torch's debug worker server (pycoll/torch/debug.py): a process with a
pycoll group and torch's C++ worker server (what ``torch.distributed.debug.start_debug_server``
starts on every rank) answers ``/handler/pycoll_status`` over HTTP with the group's state."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
c10d = pytest.importorskip("torch._C._distributed_c10d")
if not hasattr(c10d, "_register_handler") or not hasattr(c10d, "_WorkerServer"):
    pytest.skip("this torch has no debug worker server (torch >= 2.10)", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)

SCRIPT = r"""
import json, urllib.request
import torch, torch.distributed as dist
import pycoll.torch
from torch._C._distributed_c10d import _WorkerServer
dist.init_process_group("pycoll", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
server = _WorkerServer("127.0.0.1", 0)
try:
    url = f"http://127.0.0.1:{server.port}/handler/pycoll_status"
    # POST, as torch's frontend asks its workers (fetch_all)
    with urllib.request.urlopen(urllib.request.Request(url, data=b""), timeout=60) as r:
        print("ANSWER " + r.read().decode(), flush=True)
finally:
    server.shutdown()
dist.destroy_process_group()
"""


def test_the_worker_server_serves_the_groups_state() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       timeout=240, env={**os.environ, "MASTER_ADDR": "127.0.0.1"})
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("ANSWER "))
    answer = json.loads(line[7:])
    (group,) = answer["groups"]
    assert group["rank"] == 0 and group["size"] == 1 and group["pid"] > 0, group
    world = group["communicators"][0]
    assert world["state"] == "outside", world
