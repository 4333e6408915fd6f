"""One rank of a multi-host test job (env: RANK, WORLD_SIZE, LOCAL_*, MASTER_ADDR/PORT)."""
import json
import os
import socket
import sys

import numpy as np

import pycoll
from pycoll.testing import tcp_connections



comm = pycoll.init(timeout=60)
r, n = comm.rank, comm.size
a = np.arange(1000, dtype=np.float64) + r
comm.allreduce(a)
b = np.full(7, float(r))
comm.broadcast(b, n - 1)
g = np.empty(3 * n, np.int64)
comm.allgather(g, np.full(3, r, np.int64))
t = np.empty(2 * n, np.float32)
comm.alltoall(t, np.arange(2 * n, dtype=np.float32) + 100 * r)
big = np.ones(1 << 20, np.float32) * (r + 1)
comm.allreduce(big)
result = {
    "rank": r, "host": socket.gethostname(),
    "allreduce": bool(np.array_equal(a, np.arange(1000) * n + n * (n - 1) / 2)),
    "broadcast": b.tolist() == [float(n - 1)] * 7,
    "allgather": g.tolist() == [q for q in range(n) for _ in range(3)],
    "alltoall": t.tolist() == [float(2 * r + k + 100 * s) for s in range(n) for k in range(2)],
    "big": float(big[0]) == n * (n + 1) / 2,
    "transports": {p: comm.transport_of(p) for p in range(n) if p != r},
    "store": type(comm._store).__name__,
    "remotes": sorted({remote for _, _, remote, _ in tcp_connections()}),
}
with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(result, f)
pycoll.finalize()
