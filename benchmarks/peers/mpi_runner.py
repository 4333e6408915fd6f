"""MPI (mpi4py) measured by pycoll.bench's runner: MPICH and Open MPI alike.

The same file serves both MPIs; which one runs is decided by the interpreter (the venv whose
mpi4py loads that MPI's libmpi) and its launcher:

    UCX_TLS=self,sm .venv/bin/mpiexec -launcher fork -hosts 127.0.0.1 -n 2 \
        .venv/bin/python benchmarks/peers/mpi_runner.py --collectives allreduce,broadcast -m 8:16M
    OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,sm PYTHONPATH=$PWD \
        .venv-ompi/bin/mpirun --host 127.0.0.1:2 -n 2 \
        .venv-ompi/bin/python benchmarks/peers/mpi_runner.py --collectives allreduce -m 8:16M

(.venv-ompi: bash benchmarks/setup_peers.sh; it has no pycoll install, hence PYTHONPATH.)
Rank 0 prints JSON lines (see peer_common.py); the meta line's version names the MPI library.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from peer_common import build_parser, peer_main  # noqa: E402

from pycoll.bench.backend import BufferDelegate, NumpyBuffers  # noqa: E402
from pycoll.bench.runner import BenchError  # noqa: E402


class MPIBackend(BufferDelegate):
    name = "mpi"

    def __init__(self):
        import mpi4py
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()
        # Open MPI's string ends in a NUL byte
        lib = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
        self.version = f"{' '.join(lib.split())}, mpi4py {mpi4py.__version__}"
        self.bufs = NumpyBuffers()
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}

    def check_supported(self, collective, dtype, op):
        if op not in self.ops:
            raise BenchError(f"MPI has no {op!r} reduction")
        if dtype == "bfloat16":
            raise BenchError("mpi4py has no bfloat16")

    def barrier(self):
        self.comm.Barrier()

    def op(self, collective, bufs, op, root, algo):
        c = self.comm
        IN_PLACE = self.MPI.IN_PLACE
        if collective == "allreduce":
            c.Allreduce(IN_PLACE, bufs["buf"], op=self.ops[op])
        elif collective == "broadcast":
            c.Bcast(bufs["buf"], root=root)
        elif collective == "reduce":
            if self.rank == root:
                c.Reduce(IN_PLACE, bufs["buf"], op=self.ops[op], root=root)
            else:
                c.Reduce(bufs["buf"], None, op=self.ops[op], root=root)
        elif collective == "allgather":
            c.Allgather(bufs["inp"], bufs["out"])
        elif collective == "reduce_scatter":
            c.Reduce_scatter_block(bufs["inp"], bufs["out"], op=self.ops[op])
        elif collective == "alltoall":
            c.Alltoall(bufs["inp"], bufs["out"])
        elif collective == "gather":
            c.Gather(bufs["inp"], bufs["out"] if self.rank == root else None, root=root)
        elif collective == "scatter":
            c.Scatter(bufs["inp"] if self.rank == root else None, bufs["out"], root=root)
        elif collective == "barrier":
            c.Barrier()
        else:
            raise BenchError(f"unknown collective {collective!r}")

    def send(self, buf, dst):
        self.comm.Send(buf, dest=dst)

    def recv(self, buf, src):
        self.comm.Recv(buf, source=src)

    # -- one-sided: MPI_Win_allocate (or MPI_Win_create on the buffer, -w create), passive
    # target (lock/flush/unlock), as OSU's osu_put_latency -w allocate|create -s flush
    def window(self, buf):
        return self.MPI.Win.Create(buf, disp_unit=buf.itemsize, comm=self.comm)

    def allocate_window(self, count, dtype):
        item = np.dtype(dtype).itemsize
        win = self.MPI.Win.Allocate(count * item, disp_unit=item, comm=self.comm)
        return win, np.frombuffer(win.tomemory(), dtype=dtype, count=count)

    def free_window(self, win):
        win.Free()

    def lock(self, win, target):
        win.Lock(target, self.MPI.LOCK_SHARED)

    def unlock(self, win, target):
        win.Unlock(target)

    def rma(self, kind, win, buf, target, offset):
        if kind == "put":
            win.Put(buf, target, target=offset)
        elif kind == "get":
            win.Get(buf, target, target=offset)
        else:
            win.Accumulate(buf, target, target=offset, op=self.MPI.SUM)

    def flush(self, win, target):
        win.Flush(target)

    def allgather_floats(self, values):
        a = np.zeros((self.world_size, len(values)), dtype=np.float64)
        a[self.rank] = values
        self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM)
        return a

    def selected_algorithm(self, collective, nbytes, algo=None):
        return None

    def transport(self):
        knobs = [f"{k}={os.environ[k]}" for k in ("UCX_TLS", "OMPI_MCA_pml", "OMPI_MCA_btl")
                 if os.environ.get(k)]
        return "MPI shared memory" + (f" ({', '.join(knobs)})" if knobs else "")

    def finalize(self):
        pass


def main(argv=None) -> int:
    args = build_parser("mpi_runner.py").parse_args(argv)
    b = MPIBackend()
    return peer_main(b, args)


if __name__ == "__main__":
    sys.exit(main())
