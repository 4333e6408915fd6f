"""Cost of the unchecked decision (Collectives._checked(None)) on a 1-rank communicator, net
of the lambda: what an unchecked reduce, reduce_scatter or fused call now pays.

    PYTHONPATH=$PWD python benchmarks/results/2026-11-25-integrity-reduce/checked_cost.py
"""
import timeit
from pycoll.testing import run_ranks
def f(comm):
    n = 200000
    a = timeit.timeit(lambda: comm._checked(None), number=n) / n
    b = timeit.timeit(lambda: None, number=n) / n
    return (a - b) * 1e9
if __name__ == "__main__":
    print("ns per _checked(None), net of the lambda:", run_ranks(f, 1, env={"PYCOLL_TRANSPORTS": "shm"}, timeout=60))
    print("with sample:100:", run_ranks(f, 1, env={"PYCOLL_TRANSPORTS": "shm", "PYCOLL_INTEGRITY": "sample:100"}, timeout=60))
