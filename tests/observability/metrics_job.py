"""One rank of the metrics tests: waits for START, makes CALLS allreduces of 16 B and CALLS
broadcasts of 1 MiB (every result checked: a wrong one exits 2), touches READY.<rank>, and
stays outside pycoll until RELEASE exists."""
import os
import sys
import time

import numpy as np

import pycoll


def wait_for(path: str, limit: float = 120.0) -> None:
    t = time.monotonic()
    while not os.path.exists(path) and time.monotonic() - t < limit:
        time.sleep(0.02)


rank = int(os.environ["PYCOLL_RANK"])
calls = int(os.environ["CALLS"])
comm = pycoll.init()
wait_for(os.environ["START"])
expect = comm.size * (comm.size + 1) / 2
for i in range(calls):
    x = np.full(4, rank + 1, dtype=np.float32)
    comm.allreduce(x)
    if not (x == expect).all():
        print(f"rank {rank}: allreduce {i}: wrong result {x}", file=sys.stderr)
        sys.exit(2)
for i in range(calls):
    y = np.full(1 << 18, float(i) if rank == 0 else -1.0, dtype=np.float32)
    comm.broadcast(y, root=0)
    if not (y == i).all():
        print(f"rank {rank}: broadcast {i}: wrong result", file=sys.stderr)
        sys.exit(2)
open(os.environ["READY"] + f".{rank}", "w").close()
wait_for(os.environ["RELEASE"])
pycoll.finalize()
print(f"rank {rank} done")
