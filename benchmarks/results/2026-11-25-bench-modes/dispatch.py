"""Cost of one PycollBackend.op call on a world of one (no peers: the dispatch is what is timed)."""
import sys, timeit
import numpy as np
from pycoll.bench.backend import PycollBackend
b = PycollBackend()
bufs = {"buf": np.zeros(2, dtype=np.float32)}
n = 200000
best = min(timeit.repeat(lambda: b.op("allreduce", bufs, "sum", 0, None), number=n, repeat=9))
print(f"{sys.argv[1]}: {best / n * 1e9:.0f} ns per op() (best of 9 x {n})")
b.finalize()
