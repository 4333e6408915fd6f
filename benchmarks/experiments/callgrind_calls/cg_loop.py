"""Rank 0 under callgrind, instrumented only from the loops on (run.sh switches it on):
50 rounds of an 8-byte allreduce, broadcast and barrier, then N of each back to back, and
two barriers: 3 x (50 + N) + 2 calls of FastMethod (6152 with N = 2000). per_call.py reads
what FastMethod's vectorcall cost in all (the front, the bound call, the kernel)."""
import gc
import os
import sys
import time

tag = os.environ["CG_OUT"]    # where the profile and the handshake files go (a path prefix)
if os.environ.get("PYCOLL_RANK") == "0" and not os.environ.get("CG_IN"):
    os.environ["CG_IN"] = "1"
    os.execvp("valgrind", ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                           "--collect-atstart=yes",
                           f"--callgrind-out-file={tag}.out", sys.executable] + sys.argv)
# imported after the exec: rank 0's first process only execs itself under valgrind
import numpy as np  # noqa: E402

import pycoll  # noqa: E402

comm = pycoll.init(timeout=3000)
a = np.zeros(2, np.float32)
N = int(os.environ.get("CG_N", "2000"))
for _ in range(50):
    comm.allreduce(a)
    comm.broadcast(a, 0)
    comm.barrier()
comm.barrier()
gc.disable()        # a collection fires inside whichever allocation reaches the threshold
if comm.rank == 0:
    open(f"{tag}.ready", "w").write(str(os.getpid()))
    while not os.path.exists(f"{tag}.go"):
        time.sleep(0.5)
    for _ in range(50):     # warm again, instrumented
        comm.allreduce(a)
        comm.broadcast(a, 0)
        comm.barrier()
else:
    for _ in range(50):
        comm.allreduce(a)
        comm.broadcast(a, 0)
        comm.barrier()
comm.barrier()
for _ in range(N):
    comm.allreduce(a)
for _ in range(N):
    comm.broadcast(a, 0)
for _ in range(N):
    comm.barrier()
comm.barrier()
print(comm.rank, "done", flush=True)
pycoll.finalize()
