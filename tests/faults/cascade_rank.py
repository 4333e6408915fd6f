"""One rank of tests/faults/test_cascades.py: ``python cascade_rank.py`` (torchrun-style env).

Allreduce in a loop; rank ``VICTIM`` dies (``os._exit``) at step 5. Every other rank catches
the error, writes what it saw to ``$OUT/r<rank>.json`` and exits at once, as most programs
do: its channels close right after the failure, which is what used to make non-neighbours
blame a survivor. Rank 0 hosts the store (no launcher), so its death takes the store along.
"""
import json
import os
import sys
import time

import numpy as np

import pycoll

victim, out = int(os.environ["VICTIM"]), os.environ["OUT"]
comm = pycoll.init(timeout=30)
result: dict = {"rank": comm.rank}
start = time.monotonic()
try:
    a = np.ones(1 << 14, np.float32)
    for step in range(400):
        if step == 5:
            if comm.rank == victim:
                os._exit(9)
            start = time.monotonic()
        comm.allreduce(a)
    result["error"] = None
except pycoll.PycollError as e:
    result.update(kind=type(e).__name__, peer_lost=isinstance(e, pycoll.PeerLost),
                  peer=getattr(e, "peer", None), message=str(e)[:1500],
                  seconds=time.monotonic() - start)
with open(os.path.join(out, f"r{comm.rank}.json"), "w") as f:
    json.dump(result, f)
sys.exit(1)
