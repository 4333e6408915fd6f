"""One rank of the TLS test across namespace hosts: collectives checked, and a marker that
rank 0 sends to every other rank (the capture on the wire looks for it).

argv: output folder, marker text. Env: torchrun-style variables (and ``PYCOLL_TLS_*``).
"""
import json
import os
import ssl
import sys

import numpy as np

import pycoll

out, marker = sys.argv[1], sys.argv[2].encode()
comm = pycoll.init(timeout=60)
r, n = comm.rank, comm.size
payload = np.frombuffer(marker * ((1 << 20) // len(marker)), np.uint8)
got = payload.copy() if r == 0 else np.zeros_like(payload)
comm.broadcast(got, 0)
a = np.arange(1 << 18, dtype=np.float32) + r                 # 1 MiB
comm.allreduce(a)
small = np.full(3, r + 1, np.int64)
comm.allreduce(small)
ring = np.empty(1 << 16, np.int32)
works = [comm.send(np.full(1 << 16, r, np.int32), (r + 1) % n, tag=5, async_op=True),
         comm.recv(ring, (r - 1) % n, tag=5, async_op=True)]
for w in works:
    w.wait()
socks = [lane.sock for p in range(n) if p != r for lane in comm.channel(p)._lanes]
result = {
    "rank": r,
    "broadcast": bool(np.array_equal(got, payload)),
    "allreduce": bool(np.array_equal(a, np.arange(1 << 18, dtype=np.float32) * n
                                     + n * (n - 1) / 2)),
    "small": small.tolist() == [n * (n + 1) // 2] * 3,
    "sendrecv": bool((ring == (r - 1) % n).all()),
    "transports": sorted({comm.transport_of(p) for p in range(n) if p != r}),
    "tls": [s.version() if isinstance(s, ssl.SSLSocket) else None for s in socks],
    "store_tls": isinstance(getattr(comm._store, "_sock", None), ssl.SSLSocket),
}
comm.barrier()
with open(os.path.join(out, f"rank{r}.json"), "w") as f:
    json.dump(result, f)
pycoll.finalize()
