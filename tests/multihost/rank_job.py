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
# the rest of the collectives, sampled: rooted ones with a root on the last host
root = n - 1
red = np.full(5, r + 1, np.int64)
comm.reduce(red, root, op="max")
rs = np.empty(4, np.float64)
comm.reduce_scatter(rs, np.arange(4 * n, dtype=np.float64) * (r + 1))
gat = np.empty(2 * n, np.int32) if r == root else None
comm.gather(gat, np.full(2, r, np.int32), root)
sca = np.empty(3, np.float32)
comm.scatter(sca, np.repeat(np.arange(n, dtype=np.float32), 3) if r == root else None, root)
comm.barrier()
ring = np.empty(4, np.int64)
reqs = [comm.send(np.full(4, r, np.int64), (r + 1) % n, tag=7, async_op=True),
        comm.recv(ring, (r - 1) % n, tag=7, async_op=True)]
for w in reqs:
    w.wait()
coeff = n * (n + 1) / 2
others = {
    "reduce": r != root or red.tolist() == [n] * 5,
    "reduce_scatter": rs.tolist() == [float((4 * r + k) * coeff) for k in range(4)],
    "gather": r != root or gat.tolist() == [q for q in range(n) for _ in range(2)],
    "scatter": sca.tolist() == [float(r)] * 3,
    "sendrecv": ring.tolist() == [(r - 1) % n] * 4,
}
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
    "others": others,
}
with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(result, f)
pycoll.finalize()
