"""A rank of ``test_elastic_launcher.py``: an elastic job under ``pycoll.run --elastic
--nnodes K`` that loses a host and goes on.

argv: outdir, grow. Every process writes ``pid.<name>`` first (name: its rank, or ``r<pid>``
for a replacement the launcher started) with its pid and host. A rank started with the job
checks an allreduce, writes ``ready.<rank>``, then runs allreduces until the fault makes
one fail; it shrinks, checks an allreduce on the survivors, and with grow > 0 admits that
many joiners (``grow``) and checks again. A replacement joins (``PYCOLL_JOIN=1``) and checks
the same allreduce. Each ends with ``result.<name>``: what it saw, every sum checked, and
when (``time.monotonic``, one clock for every namespace host).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import numpy as np

import pycoll


def main() -> int:
    outdir, grow = sys.argv[1], int(sys.argv[2])
    replaces = os.environ.get("PYCOLL_REPLACES")
    name = f"r{os.getpid()}" if replaces else os.environ["PYCOLL_RANK"]

    def write(kind: str, data: object) -> None:
        path = os.path.join(outdir, f"{kind}.{name}")
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)

    def checked(comm: pycoll.Communicator) -> list:
        x = np.full(4, float(comm.rank + 1))
        comm.allreduce(x)
        want = comm.size * (comm.size + 1) / 2
        if not (x == want).all():
            raise SystemExit(f"{name}: allreduce gave {x}, not {want}")
        return [comm.rank, comm.size, float(x[0])]

    write("pid", {"pid": os.getpid(), "host": socket.gethostname()})
    comm = pycoll.init(timeout=90)
    record: dict = {"replaces": replaces, "host": socket.gethostname()}
    if not replaces:
        record["first"] = checked(comm)
        write("ready", record)
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                comm.allreduce(np.ones(4))
                time.sleep(0.005)
            raise SystemExit(f"{name}: no error within 60 s of the fault")
        except pycoll.PycollError as e:
            record["error"] = type(e).__name__
        record["t_error"] = time.monotonic()
        comm = pycoll.shrink(timeout=60)
        record["shrunk"] = checked(comm)
        record["t_shrunk"] = time.monotonic()
        if grow:
            comm = pycoll.grow(grow, timeout=60)
    else:
        record["t_joining"] = time.monotonic()
    record["last"] = checked(comm)
    record["t_last"] = time.monotonic()
    write("result", record)
    pycoll.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
