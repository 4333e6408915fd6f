"""The default communicator behind the module-level API (``pycoll.init``, ``pycoll.allreduce``).

``init()`` reads its rank, world size and rendezvous address from arguments or from the
environment of any common launcher (pycoll.run, torchrun, Open MPI, MPICH/Hydra, Slurm; see
``pycoll.launch.environment``). Rank 0 embeds the rendezvous server unless the launcher
already runs one.
"""
from __future__ import annotations

import atexit
from datetime import timedelta
from typing import Any

from .buffers.reduction import OpLike
from .comm.communicator import DEFAULT_TIMEOUT, Communicator
from .comm.windows import Window
from .envvars import env_bool
from .errors import PycollError
from .launch.join import join as join_job
from .runtime.work import Work
from .timeouts import as_seconds

_world: Communicator | None = None


def init(rank: int | None = None, world_size: int | None = None, *,
         master_addr: str | None = None, master_port: int | None = None,
         timeout: float | timedelta = DEFAULT_TIMEOUT, comm: Any = None,
         deterministic: bool | None = None, accumulate: str | None = None,
         compress: str | None = None, join: bool | None = None) -> Communicator:
    """Join the job and return the world communicator (also kept as the default).

    With no arguments everything comes from the launcher's environment; a process started
    without any launcher is a world of one. ``comm``: an mpi4py communicator to bootstrap
    from (its ranks become pycoll's; rank 0's store address and the job secret travel over
    MPI), which plain ``init()`` also uses under mpiexec on several hosts without MASTER_ADDR.
    ``deterministic``, ``accumulate``: the defaults of every reducing call
    (docs/numerics.md; default ``PYCOLL_DETERMINISTIC``, ``PYCOLL_ACCUMULATE``).
    ``compress``: the wire format of float allreduce, reduce_scatter, allgather and
    broadcast calls ("bf16", "fp16", "fp8", "int8"; default ``PYCOLL_COMPRESS``, else none).
    ``join`` (default ``PYCOLL_JOIN``, which ``pycoll.run --elastic --max-restarts`` sets in
    a replacement): join the running job instead, once its ranks call ``grow``
    (docs/elastic.md); this process's rank then follows theirs.
    """
    global _world
    seconds = as_seconds(timeout) or DEFAULT_TIMEOUT
    if _world is not None:
        raise PycollError("pycoll.init() was already called in this process; call "
                          "pycoll.finalize() first to start over")
    joining = env_bool("PYCOLL_JOIN", False) if join is None else bool(join)
    store, r, n, secret, addr = join_job(rank, world_size, master_addr, master_port, seconds,
                                         comm, joining)
    if joining:
        assert store is not None
        try:
            _world = Communicator.join(store, timeout=seconds, token=secret, master_addr=addr)
        except BaseException:
            store.close()
            raise
        _register_finalize_last()
        return _world
    try:
        _world = Communicator.create(store, r, n, timeout=seconds, token=secret,
                                     master_addr=addr, owns_store=store is not None,
                                     deterministic=deterministic, accumulate=accumulate,
                                     compress=compress)
    except BaseException:
        if store is not None:
            store.close()
        raise
    _register_finalize_last()
    return _world


def _register_finalize_last() -> None:
    """atexit runs handlers last-registered-first: registered again now, ``finalize`` runs
    before the store server's own exit hook (a weakref finalizer registered when the store
    was made), so the server stays up while this rank lingers for the others to read the
    abort record (a rank that exits right after an error must not take the job's only
    channel for root causes down with it); the exit marker goes before both."""
    from .runtime.abort import register_exit_marker

    atexit.unregister(_finalize_at_exit)
    atexit.register(_finalize_at_exit)
    register_exit_marker(again=True)


def is_initialized() -> bool:
    return _world is not None


def world() -> Communicator:
    """The default communicator; raises if ``init()`` has not run."""
    if _world is None:
        raise PycollError("pycoll is not initialized: call pycoll.init() first")
    return _world


def finalize() -> None:
    """Tear down the default communicator (channels, shared memory, store)."""
    global _world
    if _world is not None:
        comm, _world = _world, None
        comm.finalize()


def _finalize_at_exit() -> None:
    """``finalize`` at interpreter exit, for a program that did not call it. A failure it
    finds (a last one-way broadcast that the ranks disagreed about) must not end as Python's
    "Exception ignored in atexit callback" with exit code 0, which a launcher reports as
    success: like an uncaught exception, it is printed and the process exits with code 1
    (as MPI_Finalize's error reaches mpirun), once the exit handlers registered before this
    one have run (they would have run after it)."""
    try:
        finalize()
    except BaseException as e:  # noqa: BLE001 - whatever it is, the exit code must say so
        import os
        import sys
        import traceback

        sys.stderr.write("".join(traceback.format_exception(e)))
        sys.stderr.write(f"pycoll: the automatic finalize at exit failed: {type(e).__name__}: "
                         f"{e}\npycoll: exiting with code 1 (call pycoll.finalize() to handle "
                         "it in the program)\n")
        try:
            atexit._run_exitfuncs()     # the other handlers (this one finds nothing left)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001, S110 - a closed stream: nothing to flush
                    pass
            os._exit(1)


atexit.register(_finalize_at_exit)


def get_rank() -> int:
    return world().rank


def get_world_size() -> int:
    return world().size


def allreduce(tensor: Any, op: OpLike = "sum", *, algo: str | None = None,
              timeout: float | None = None, async_op: bool = False,
              deterministic: bool | None = None, accumulate: str | None = None,
              integrity: bool | None = None, compress: str | None = None,
              out: Any = None) -> Work | None:
    """Allreduce ``tensor`` on the default communicator (in place unless ``out`` is given)."""
    return world().allreduce(tensor, op, algo=algo, timeout=timeout, async_op=async_op,
                             deterministic=deterministic, accumulate=accumulate,
                             integrity=integrity, compress=compress, out=out)


def allreduce_init(tensor: Any, op: OpLike = "sum", *, algo: str | None = None,
                   timeout: float | None = None, deterministic: bool | None = None,
                   accumulate: str | None = None, **options: Any) -> Any:
    """A persistent allreduce of ``tensor`` on the default communicator
    (``Communicator.allreduce_init``; ``options``: the call's others, ``compress=``...)."""
    return world().allreduce_init(tensor, op, algo=algo, timeout=timeout,
                                  deterministic=deterministic, accumulate=accumulate,
                                  **options)


def barrier(*, algo: str | None = None, timeout: float | None = None,
            async_op: bool = False) -> Work | None:
    """Block until every rank of the default communicator has reached the barrier."""
    return world().barrier(algo=algo, timeout=timeout, async_op=async_op)


# The rest mirror Communicator's methods on the default communicator; keyword options
# (algo=, timeout=, async_op=) are passed through unchanged.
def broadcast(tensor: Any, root: int = 0, **options: Any) -> Work | None:
    return world().broadcast(tensor, root, **options)


def reduce(tensor: Any, root: int = 0, op: OpLike = "sum", **options: Any) -> Work | None:
    return world().reduce(tensor, root, op, **options)


def allgather(output: Any, input: Any, **options: Any) -> Work | None:
    return world().allgather(output, input, **options)


def reduce_scatter(output: Any, input: Any, op: OpLike = "sum", **options: Any) -> Work | None:
    return world().reduce_scatter(output, input, op, **options)


def alltoall(output: Any, input: Any, out_splits: Any = None, in_splits: Any = None,
             **options: Any) -> Work | None:
    return world().alltoall(output, input, out_splits, in_splits, **options)


def gather(output: Any, input: Any, root: int = 0, **options: Any) -> Work | None:
    return world().gather(output, input, root, **options)


def scatter(output: Any, input: Any, root: int = 0, **options: Any) -> Work | None:
    return world().scatter(output, input, root, **options)


def send(tensor: Any, dst: int, tag: int = 0, **options: Any) -> Work | None:
    return world().send(tensor, dst, tag, **options)


def recv(tensor: Any, src: int | None = None, tag: int = 0, **options: Any) -> Work | int | None:
    return world().recv(tensor, src, tag, **options)


def reduce_scatter_v(output: Any, input: Any, counts: Any, op: OpLike = "sum",
                     **options: Any) -> Work | None:
    return world().reduce_scatter_v(output, input, counts, op, **options)


def gatherv(output: Any, input: Any, counts: Any, root: int = 0, **options: Any) -> Work | None:
    return world().gatherv(output, input, counts, root, **options)


def scatterv(output: Any, input: Any, counts: Any, root: int = 0, **options: Any) -> Work | None:
    return world().scatterv(output, input, counts, root, **options)


def allreduce_coalesced(tensors: Any, op: OpLike = "sum", **options: Any) -> Work | None:
    return world().allreduce_coalesced(tensors, op, **options)


def allgather_coalesced(outputs: Any, inputs: Any, **options: Any) -> Work | None:
    return world().allgather_coalesced(outputs, inputs, **options)


def allgatherv(input: Any, **options: Any) -> Any:
    return world().allgatherv(input, **options)


# Persistent plans of the other collectives (``Communicator.broadcast_init``...).
def broadcast_init(tensor: Any, root: int = 0, **options: Any) -> Any:
    return world().broadcast_init(tensor, root, **options)


def reduce_init(tensor: Any, root: int = 0, op: OpLike = "sum", **options: Any) -> Any:
    return world().reduce_init(tensor, root, op, **options)


def allgather_init(output: Any, input: Any, **options: Any) -> Any:
    return world().allgather_init(output, input, **options)


def reduce_scatter_init(output: Any, input: Any, op: OpLike = "sum", **options: Any) -> Any:
    return world().reduce_scatter_init(output, input, op, **options)


def alltoall_init(output: Any, input: Any, out_splits: Any = None, in_splits: Any = None,
                  **options: Any) -> Any:
    return world().alltoall_init(output, input, out_splits, in_splits, **options)


def gather_init(output: Any, input: Any, root: int = 0, **options: Any) -> Any:
    return world().gather_init(output, input, root, **options)


def scatter_init(output: Any, input: Any, root: int = 0, **options: Any) -> Any:
    return world().scatter_init(output, input, root, **options)


def barrier_init(**options: Any) -> Any:
    return world().barrier_init(**options)


def reduce_scatter_v_init(output: Any, input: Any, counts: Any, op: OpLike = "sum",
                          **options: Any) -> Any:
    return world().reduce_scatter_v_init(output, input, counts, op, **options)


def gatherv_init(output: Any, input: Any, counts: Any, root: int = 0, **options: Any) -> Any:
    return world().gatherv_init(output, input, counts, root, **options)


def scatterv_init(output: Any, input: Any, counts: Any, root: int = 0, **options: Any) -> Any:
    return world().scatterv_init(output, input, counts, root, **options)


def window(buffer: Any, **options: Any) -> Window:
    """``Communicator.window`` on the default communicator (collective; docs/windows.md)."""
    return world().window(buffer, **options)


def allocate_window(count: int, dtype: Any = "float32", **options: Any) -> Window:
    """``Communicator.allocate_window`` on the default communicator (collective)."""
    return world().allocate_window(count, dtype, **options)


def new_group(ranks: Any) -> Communicator | None:
    """A communicator of ``ranks`` (world ranks); every world rank must call it, in order.

    Returns None on ranks outside the group.
    """
    return world().new_group(ranks)


def shrink(exclude: Any = (), *, timeout: float | None = None) -> Communicator:
    """``Communicator.shrink`` of the default communicator, which the result replaces (the
    module-level calls use it from then on); docs/elastic.md."""
    global _world
    comm = world().shrink(exclude, timeout=timeout)
    _world = comm
    return comm


def grow(count: int | None = None, *, timeout: float | None = None) -> Communicator:
    """``Communicator.grow`` of the default communicator, which the result replaces;
    docs/elastic.md."""
    global _world
    comm = world().grow(count, timeout=timeout)
    _world = comm
    return comm
