"""A parameter server over a one-sided window, and the same training written with allreduce.

Rank 0 is the server: its window holds the weights and a gradient sum. Every step each worker
``get``s the weights, computes its gradient and ``accumulate``s it into the server's sum (the
accumulates of all workers are atomic with respect to each other); after a ``fence`` the
server applies the mean gradient and clears the sum; a second fence publishes the weights.
``allreduce_training`` is the same computation with an allreduce of the gradients (the server
contributes zeros, so both run on the same ranks). Both return the final weights and the
seconds per step. Run: python -m pycoll.run -n 5 examples/param_server.py
"""
from __future__ import annotations

import time

import numpy as np

import pycoll

LR = 0.1


def gradient(weights: np.ndarray, rank: int, step: int) -> np.ndarray:
    """A worker's gradient of ``0.5 * |w - target|^2`` on its own data (its target)."""
    target = np.random.default_rng(rank).standard_normal(weights.size)
    return (weights - target) * (1.0 + 0.01 * step)


def window_training(comm: pycoll.Communicator, steps: int, dim: int
                    ) -> tuple[np.ndarray, float]:
    workers = comm.size - 1
    state = np.zeros(2 * dim)                 # the server's [weights | gradient sum]
    weights = np.zeros(dim)
    with comm.window(state if comm.rank == 0 else np.zeros(2 * dim)) as win:
        win.fence()
        start = time.perf_counter()
        for step in range(steps):
            if comm.rank > 0:
                win.get(weights, 0)                               # pull the weights
                win.accumulate(gradient(weights, comm.rank, step), 0, offset=dim)
            win.fence()                                           # every gradient is in
            if comm.rank == 0:
                state[:dim] -= LR * state[dim:] / workers
                state[dim:] = 0.0
            win.fence()                                           # the new weights are out
        per_step = (time.perf_counter() - start) / steps
        if comm.rank == 0:
            weights[:] = state[:dim]
        else:
            win.get(weights, 0)
        win.fence()
    return weights, per_step


def allreduce_training(comm: pycoll.Communicator, steps: int, dim: int
                       ) -> tuple[np.ndarray, float]:
    workers = comm.size - 1
    weights = np.zeros(dim)
    grad = np.zeros(dim)
    comm.barrier()
    start = time.perf_counter()
    for step in range(steps):
        grad[:] = gradient(weights, comm.rank, step) if comm.rank > 0 else 0.0
        comm.allreduce(grad)
        weights -= LR * grad / workers
    return weights, (time.perf_counter() - start) / steps


def main(comm: pycoll.Communicator, steps: int = 20, dim: int = 1 << 16
         ) -> tuple[float, float, float]:
    """Both trainings; (largest difference of their weights, seconds per step of each)."""
    w1, t_window = window_training(comm, steps, dim)
    w2, t_allreduce = allreduce_training(comm, steps, dim)
    return float(np.abs(w1 - w2).max()), t_window, t_allreduce


if __name__ == "__main__":
    world = pycoll.init()
    diff, t_window, t_allreduce = main(world)
    if world.rank == 0:
        print(f"{world.size - 1} workers: window {t_window * 1e3:.3f} ms/step, allreduce "
              f"{t_allreduce * 1e3:.3f} ms/step, largest weight difference {diff:.2e}")
    pycoll.finalize()
