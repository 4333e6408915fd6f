"""References on the same GPU under torchrun: Gloo on CUDA tensors, and NCCL (one rank, or
several ranks on the one GPU where NCCL accepts NCCL_MULTI_RANK_GPU_ENABLE=1).

    python3 -m torch.distributed.run --standalone --nproc-per-node N tools/gpu/reference.py BACKEND

Prints, on rank 0, one line per size: the allreduce's time and nccl-tests' busbw, timed as
nccl-tests does (ops back to back, one synchronisation). Small sizes (8 B-4 KiB) give the
latency that pycoll's small device allreduces are compared with.
"""
from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

SIZES = [8, 64, 512, 4096, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]


def main() -> None:
    backend = sys.argv[1]
    dist.init_process_group(backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(0)
    if rank == 0 and backend == "nccl":
        print("NCCL version", torch.cuda.nccl.version(), flush=True)
    for size in SIZES:
        t = torch.ones(max(1, size // 4), device="cuda")
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dist.barrier()
        reps = 3 if size >= 256 << 20 else (20 if size >= 1 << 20 else 200)
        start = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - start) / reps
        if rank == 0:
            busbw = 2 * (n - 1) / n * size / dt / 1e9 if n > 1 else size / dt / 1e9
            print(f"{backend} allreduce n={n} {size} B: {dt * 1e6:.1f} us busbw {busbw:.2f} GB/s",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
