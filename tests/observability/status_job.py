"""One rank of the jobs tests/observability looks into: a loop of allreduces, with one rank
made to misbehave as the environment says.

STEP_S     the user code's time per step (a sleep)
SLOW       this rank's steps take SLOW_FACTOR x STEP_S (a straggler)
SLEEPER    this rank stops in user code at step 50 until the file RELEASE exists
GIL        this rank runs one long numpy call at step 50 (touching MARK before it and
           MARK.done after it): GIL_CALL "holds" sorts GIL_N Python ints in an object array
           (numpy holds the GIL: each comparison is a Python object's), "releases" sorts
           GIL_N float64 (numpy releases the GIL while it sorts)
RELEASE    the loop ends once this file exists (or after MAX_STEPS)
FAILED     where a rank that lost a peer writes so, then waits for RELEASE
STATS      rank 0 prints comm.stats()'s stragglers once the loop ends

Every result is checked; a wrong one exits 2.
"""
import json
import os
import sys
import time

import numpy as np

import pycoll
from pycoll import PycollError

rank = int(os.environ["PYCOLL_RANK"])
step_s = float(os.environ.get("STEP_S", "0.01"))
if rank == int(os.environ.get("SLOW", "-1")):
    step_s *= float(os.environ.get("SLOW_FACTOR", "1.2"))
release = os.environ["RELEASE"]
max_steps = int(os.environ.get("MAX_STEPS", "20000"))


def wait_release(limit: float = 120.0) -> None:
    t = time.monotonic()
    while not os.path.exists(release) and time.monotonic() - t < limit:
        time.sleep(0.02)


comm = pycoll.init()
size = comm.size
expect = size * (size + 1) / 2
try:
    for i in range(max_steps):
        if i > 60 and i % 20 == 0:    # every rank stops at the same step
            stop = np.array([float(os.path.exists(release))], dtype=np.float32)
            comm.allreduce(stop, op="max")
            if stop[0]:
                break
        time.sleep(step_s)
        if i == 50 and rank == int(os.environ.get("SLEEPER", "-1")):
            wait_release()
        if i == 50 and rank == int(os.environ.get("GIL", "-1")):
            n = int(os.environ.get("GIL_N", "3000000"))
            rng = np.random.default_rng(0)
            if os.environ.get("GIL_CALL", "holds") == "holds":
                data = rng.integers(0, 1 << 60, n).astype(object)
            else:
                data = rng.random(n)
            open(os.environ["MARK"], "w").close()
            np.sort(data)                       # one numpy call
            open(os.environ["MARK"] + ".done", "w").close()
            del data
        x = np.full(4, rank + 1, dtype=np.float32)
        comm.allreduce(x)
        if not (x == expect).all():
            print(f"rank {rank}: step {i}: wrong result {x}", file=sys.stderr)
            sys.exit(2)
except PycollError as e:
    with open(os.environ["FAILED"] + f".{rank}", "w") as f:
        f.write(str(e))
    wait_release()
    sys.exit(3)
if os.environ.get("STATS"):       # a program asks for the stragglers itself
    if rank == 0:
        print("STATS " + json.dumps(comm.stats()["stragglers"]), flush=True)
    comm.barrier()
pycoll.finalize()
print(f"rank {rank} done")
