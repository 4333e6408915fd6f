"""The CUDA code paths' logic, ordering and lifetimes: async calls, finalize, zero-byte
buffers, ranks started after CUDA was initialised, staged calls back to back, peer death.

Device arrays come from ``runtime.cupy()``: CuPy on a GPU, the simulator elsewhere (see
conftest.py). Each test names the defect it guards against.
"""
from __future__ import annotations

import numpy as np
import pytest

from pycoll.cuda import runtime
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(240)


def _cp():
    return runtime.cupy()


def _host(arr):
    """The bytes of a device array once everything queued so far (any stream) has run."""
    cp = _cp()
    cp.cuda.Device(0).synchronize()
    return cp.asnumpy(arr)


def _async_allreduce_then_finalize(comm, rounds, count):
    cp = _cp()
    got = []
    for k in range(rounds):
        x = cp.asarray(np.full(count, comm.rank + 1 + k, dtype=np.float32))
        work = comm.allreduce(x, async_op=True)
        work.wait()
        got.append(float(_host(x)[0]))
    return got     # finalize follows at once (run_ranks)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("count", [1000, 1 << 20])     # eager messages; rendezvous (4 MiB)
def test_async_calls_over_cuda_ipc(world_size, count):
    """Async work runs on pycoll's thread, which has no current CUDA context until a runtime
    call makes the device current: the IPC export's driver call (a rendezvous) failed there
    (CUresult 201). And a send completed only when its receiver called into pycoll again,
    so an async call followed by finalize failed."""
    results = run_ranks(_async_allreduce_then_finalize, world_size, 3, count, timeout=180,
                        env={"PYCOLL_TRANSPORTS": "cuda_ipc"})
    want = [sum(r + 1 + k for r in range(world_size)) for k in range(3)]
    assert results == [want] * world_size


def _send_then_finalize(comm, nbytes):
    cp = _cp()
    if comm.rank == 0:
        comm.send(cp.asarray(np.arange(nbytes, dtype=np.uint8)), 1, tag=5)
        return None
    buf = cp.zeros(nbytes, dtype=np.uint8)
    comm.recv(buf, 0, tag=5)
    return _host(buf).tolist()


def test_send_completes_without_the_receiver_calling_again():
    """The sender's request completes once the receiver's copy has run, not when the
    receiver next calls into pycoll: the sender finalizes right after its send."""
    for _ in range(3):
        results = run_ranks(_send_then_finalize, 2, 300, timeout=120,
                            env={"PYCOLL_TRANSPORTS": "cuda_ipc"})
        assert results[1] == [i % 256 for i in range(300)]


_STARTS_AFTER_INIT = """
import sys
import numpy as np
from pycoll.cuda import runtime
from pycoll.testing import run_ranks


def device_allreduce(comm):
    cp = runtime.cupy()
    x = cp.asarray(np.full(64, comm.rank + 1, dtype=np.int32))
    comm.allreduce(x)
    cp.cuda.Device(0).synchronize()
    return cp.asnumpy(x).tolist()


if __name__ == "__main__":
    assert runtime.unavailable_reason() is None      # initialises CUDA in this process
    assert runtime.initialised()
    for got in run_ranks(device_allreduce, 2, timeout=120,
                         env={"PYCOLL_TRANSPORTS": "cuda_ipc"}):
        assert got == [3] * 64, got
    print("ranks ok")
"""


def test_ranks_start_after_cuda_was_initialised_here(tmp_path, device_runtime):
    """A process that initialised CUDA (probing the device) forked ranks that could not use
    it (cudaErrorInitializationError): the harness starts them with spawn. Run in a child
    process, so that this one stays uninitialised (and keeps forking its other tests')."""
    import os
    import subprocess
    import sys
    script = tmp_path / "starts_after_init.py"
    script.write_text(_STARTS_AFTER_INIT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **device_runtime})
    assert proc.returncode == 0 and "ranks ok" in proc.stdout, proc.stderr[-3000:]


def _back_to_back_async(comm, rounds):
    cp = _cp()
    n = comm.size
    wrong = []
    for k in range(rounds):
        x = cp.asarray(np.full(4096, 1.0, dtype=np.float64))
        first = comm.allreduce(x, async_op=True)
        second = comm.allreduce(x, async_op=True)     # reads the first one's result
        first.wait()
        second.wait()
        got = float(_host(x)[0])
        if got != n * n:
            wrong.append((k, got))
    return wrong


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_back_to_back_async_staged_calls_on_one_tensor(transport):
    """Staged calls copied their device buffers to the host when submitted, but the copy
    back of the call before them only when that one ran: a second async call on the same
    tensor read its value from before the first."""
    for wrong in run_ranks(_back_to_back_async, 2, 5, timeout=180,
                           env={"PYCOLL_TRANSPORTS": transport}):
        assert wrong == []


def _premul_sum(comm, dtype):
    from pycoll import ReduceOp
    cp = _cp()
    x = cp.asarray(np.full(100, comm.rank + 1, dtype=dtype))
    comm.allreduce(x, ReduceOp.premul_sum(0.5))
    y = cp.asarray(np.full(100, comm.rank + 1, dtype=dtype))
    comm.reduce(y, root=0, op=ReduceOp.premul_sum(0.5))
    return float(_host(x)[0]), float(_host(y)[0])


@pytest.mark.parametrize("transport", ["cuda_ipc", "shm"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_premul_sum_on_device(transport, dtype):
    """premul_sum multiplies every input by its factor first: on the direct path that step
    ran the host kernel on device arrays."""
    results = run_ranks(_premul_sum, 2, dtype, timeout=120, env={"PYCOLL_TRANSPORTS": transport})
    assert results[0] == (1.5, 1.5)
    assert results[1][0] == 1.5


def _host_only_job(comm):
    import sys
    x = np.full(8, comm.rank + 1.0)
    comm.allreduce(x)
    sim = sys.modules.get("pycoll.cuda.simulator")
    return x.tolist(), comm.transport_summary(), bool(sim is not None and sim.initialised())


def test_host_only_jobs_do_not_initialise_cuda():
    """The cuda_ipc probe runs on every rank of every job: it asked for the device count,
    which initialises CUDA (start-up cost; no fork afterwards) in jobs that never touch a
    device. It now asks only whether CuPy and the driver are installed."""
    for got, summary, initialised in run_ranks(_host_only_job, 2, timeout=120):
        assert got == [3.0] * 8
        assert "cuda_ipc" in summary          # the simulator counts as installed
        assert not initialised


def _allreduce_with_deprecations_as_errors(comm):
    import warnings
    x = _cp().asarray(np.full(8, comm.rank + 1.0, dtype=np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        comm.allreduce(x)
    return _host(x).tolist()


@pytest.mark.parametrize("transport", ["cuda_ipc", "shm"])
def test_caller_streams_are_wrapped_without_deprecated_cupy_calls(transport):
    """Every call orders itself after the caller's stream (a raw handle) and the caller's
    stream after it. It wrapped the handle with ``ExternalStream``, which CuPy 14 deprecates
    (a DeprecationWarning at each construction; CuPy 15 removes it); the simulator warns as
    CuPy 14 does. It records on and waits for the handle with the runtime's calls now."""
    for got in run_ranks(_allreduce_with_deprecations_as_errors, 2, timeout=120,
                         env={"PYCOLL_TRANSPORTS": transport}):
        assert got == [3.0] * 8


class _DLPackOnlyDevice:
    """A CUDA tensor seen only through DLPack (no __cuda_array_interface__, not torch)."""

    def __dlpack_device__(self):
        return (2, 0)        # kDLCUDA, device 0

    def __dlpack__(self, stream=None):
        raise BufferError("this test object exports no capsule")


def _dlpack_only(comm):
    from pycoll.errors import InvalidArgument
    try:
        comm.allreduce(_DLPackOnlyDevice())
        return "no error"
    except InvalidArgument as e:
        return str(e)


def test_dlpack_only_cuda_objects_are_refused_with_a_way_out():
    """A DLPack-only CUDA object was taken with dtype "unknown" and count -1: a call on it
    moved nothing and raised nothing. It is viewed through torch where torch can, and refused
    with what to pass instead otherwise."""
    for message in run_ranks(_dlpack_only, 2, timeout=120):
        assert "DLPack" in message and "__cuda_array_interface__" in message, message


def _device_peer_dies(comm, nbytes):
    import os

    from pycoll.errors import PeerLost
    cp = _cp()
    x = cp.asarray(np.ones(nbytes // 4, dtype=np.float32))
    comm.allreduce(x)
    if comm.rank == 1:
        os._exit(3)              # dies between two collectives, its device memory with it
    try:
        for _ in range(3):
            comm.allreduce(x)
        return "no error"
    except PeerLost as e:
        return "PeerLost: " + str(e)


@pytest.mark.parametrize("transport", ["cuda_ipc", "shm"])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20])     # eager, and a rendezvous on cuda_ipc
def test_peer_death_during_device_collectives(transport, nbytes):
    """A rank that dies is named by the others (PeerLost naming it), never a hang and never
    a copy out of memory that is gone reported as data."""
    outcomes = run_ranks(_device_peer_dies, 3, nbytes, timeout=180, expect_failure=True,
                         env={"PYCOLL_TRANSPORTS": transport}, collective_timeout=60)
    for rank in (0, 2):
        kind, value = outcomes[rank]
        assert kind == "ok" and value.startswith("PeerLost") and "rank 1" in value, \
            (rank, kind, value)


class _UnsharableDevice:
    """Device memory no allocation of this process holds (so no IPC handle can name it);
    it says its device, as CuPy arrays do, so nothing asks the driver before the send."""

    def __init__(self, nbytes):
        import types
        self.device = types.SimpleNamespace(id=0)
        self.__cuda_array_interface__ = {
            "shape": (nbytes // 4,), "typestr": "<f4", "data": ((1 << 48) + (1 << 44), False),
            "version": 3, "strides": None, "stream": 1}


def _unsharable(comm):
    from pycoll.errors import PycollError
    try:
        comm.allreduce(_UnsharableDevice(4 << 20))      # a rendezvous on every rank
        return "no error"
    except PycollError as e:
        return f"{type(e).__name__}: {e}"


def test_a_device_send_that_cannot_be_exported_names_its_cause():
    """A rendezvous send whose memory cannot be shared failed its request, but the call
    waited on a receive from the same peer, and ended at the deadline as a timeout that hid
    the cause. The pair now breaks at once with the cause."""
    outcomes = run_ranks(_unsharable, 2, timeout=120, collective_timeout=20)
    assert all("cuMemGetAddressRange" in o and "Timeout" not in o for o in outcomes), outcomes


def _plan_beside_a_staged_call(comm):
    """A call's device buffer staged on the communicator's planner (as between its planning
    and its execution taking it, on another thread), then a plan made of another buffer:
    planning runs on a twin of the planner, so the call keeps its staging."""
    cp = _cp()
    comm._plan.buffer(cp.asarray(np.ones(16, dtype=np.float32)), "allgather")
    before = len(comm._plan.device_buffers)
    plan = comm.allgather_init(cp.asarray(np.zeros(8 * comm.size, dtype=np.float32)),
                               cp.asarray(np.ones(8, dtype=np.float32)))
    kept = len(comm._plan.device_buffers)
    comm._plan.begin()                                   # the staged call, given back
    plan.run()
    return before, kept


def test_planning_a_plan_leaves_another_calls_staging_alone():
    """A plan's planning copy shared the Planner: its ``finally: begin()`` gave back the
    page-locked staging of a call another thread had staged but not yet run."""
    out = run_ranks(_plan_beside_a_staged_call, 2, env={"PYCOLL_TRANSPORTS": "shm"})
    assert out == [(1, 1)] * 2, out
