"""torch.distributed with the Gloo backend, measured by pycoll.bench's runner.

Started once per rank with torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), e.g. by benchmarks/compare.py or ``torchrun --nproc-per-node 2``::

    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 benchmarks/peers/gloo_runner.py \
        --collectives allreduce,broadcast -m 8:16M

Rank 0 prints JSON lines (see peer_common.py).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from peer_common import build_parser, peer_main  # noqa: E402

from pycoll.bench.backend import BufferDelegate, TorchBuffers  # noqa: E402
from pycoll.bench.runner import BenchError  # noqa: E402


class GlooBackend(BufferDelegate):
    name = "gloo"

    def __init__(self):
        import torch
        import torch.distributed as dist
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.torch = torch
        self.dist = dist
        self.version = f"torch {torch.__version__}"
        dist.init_process_group("gloo", init_method="env://")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.bufs = TorchBuffers("cpu")
        R = dist.ReduceOp
        self.ops = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX}
        # torch 2.13 renamed the tensor variants (the old names warn)
        self._allgather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                                or dist.reduce_scatter_tensor)

    def check_supported(self, collective, dtype, op):
        if op not in self.ops:
            raise BenchError(f"gloo has no {op!r} reduction")

    def barrier(self):
        self.dist.barrier()

    def op(self, collective, bufs, op, root, algo):
        d = self.dist
        n = self.world_size
        if collective == "allreduce":
            d.all_reduce(bufs["buf"], op=self.ops[op])
        elif collective == "broadcast":
            d.broadcast(bufs["buf"], src=root)
        elif collective == "reduce":
            d.reduce(bufs["buf"], dst=root, op=self.ops[op])
        elif collective == "allgather":
            self._allgather(bufs["out"], bufs["inp"])
        elif collective == "reduce_scatter":
            self._reduce_scatter(bufs["out"], bufs["inp"], op=self.ops[op])
        elif collective == "alltoall":
            d.all_to_all_single(bufs["out"], bufs["inp"])
        elif collective == "gather":
            gl = list(bufs["out"].chunk(n)) if self.rank == root else None
            d.gather(bufs["inp"], gather_list=gl, dst=root)
        elif collective == "scatter":
            sl = list(bufs["inp"].chunk(n)) if self.rank == root else None
            d.scatter(bufs["out"], scatter_list=sl, src=root)
        elif collective == "barrier":
            d.barrier()
        else:
            raise BenchError(f"unknown collective {collective!r}")

    def send(self, buf, dst):
        self.dist.send(buf, dst)

    def recv(self, buf, src):
        self.dist.recv(buf, src)

    def allgather_floats(self, values):
        t = self.torch.zeros((self.world_size, len(values)), dtype=self.torch.float64)
        t[self.rank] = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.all_reduce(t)
        return t.numpy().astype(np.float64)

    def selected_algorithm(self, collective, nbytes, algo=None):
        return None

    def transport(self):
        return f"gloo tcp ({os.environ.get('GLOO_SOCKET_IFNAME', 'default')})"

    def finalize(self):
        self.dist.destroy_process_group()


def main(argv=None) -> int:
    args = build_parser("gloo_runner.py").parse_args(argv)
    b = GlooBackend()
    try:
        return peer_main(b, args, {"torch_threads": b.torch.get_num_threads()})
    finally:
        b.finalize()


if __name__ == "__main__":
    sys.exit(main())
