import sys, time
import numpy as np
from pycoll.testing import run_ranks
def body(comm, coll, count):
    inp = np.ones(count, np.float32); out = np.zeros(count * comm.size, np.float32)
    for _ in range(20): 
        comm.gather(out, inp, 0) if coll == "gather" else comm.scatter(inp, out, 0)
    comm.barrier()
    t = time.perf_counter()
    for _ in range(300):
        comm.gather(out, inp, 0) if coll == "gather" else comm.scatter(inp, out, 0)
    comm.barrier()
    return (time.perf_counter() - t) / 300 * 1e6
print(sys.argv[1:], [round(x, 1) for x in run_ranks(body, 2, sys.argv[1], int(sys.argv[2]), env={"PYCOLL_TRANSPORTS": "shm"})])
