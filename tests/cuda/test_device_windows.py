"""One-sided windows with device memory (docs/windows.md#device-memory), on a GPU where CuPy
sees one and on pycoll's CPU simulator of CUDA elsewhere (conftest.py): real rank processes.

cuda_ipc exposes device windows (origins map the target's allocation through its IPC
handle); every transport takes device sources and destinations, staged through host at the
origin; a transport that cannot expose device memory refuses the window on every rank.
"""
from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll.cuda import runtime
from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(300)

N = 16


def _cp():
    return runtime.cupy()


def _host(arr):
    cp = _cp()
    cp.cuda.Device(0).synchronize()
    return cp.asnumpy(arr)


def _device_window_ops(comm, device_window):
    """Every rank puts its block into every rank's window (from device memory), gets its
    right neighbour's window into device memory, accumulates into rank 0 and signals it."""
    cp = _cp()
    r, s = comm.rank, comm.size
    window = cp.zeros(N * s + 4, dtype=np.float32) if device_window \
        else np.zeros(N * s + 4, dtype=np.float32)
    with comm.window(window) as win:
        for t in range(s):
            win.put(cp.asarray(np.arange(N, dtype=np.float32) + 100 * (r + 1)), t,
                    offset=r * N)
        win.fence()
        mine = _host(window) if device_window else window.copy()
        got = cp.zeros(N * s, dtype=np.float32)
        win.get(got, (r + 1) % s)
        got = _host(got)
        win.fence()
        for _ in range(3):      # concurrent accumulates from every rank into rank 0's tail
            win.accumulate(cp.asarray(np.full(4, r + 1.0, dtype=np.float32)), 0, offset=N * s)
        work = win.accumulate(np.full(4, 1.0, dtype=np.float32), 0, offset=N * s, op="sum",
                              async_op=True)
        work.wait()
        if r != 0:
            win.signal(0, 1)
        else:
            win.wait_signal(s - 1, timeout=60)
        win.fence()
        tail = (_host(window) if device_window else window.copy())[N * s:]
    return mine.tolist(), got.tolist(), tail.tolist()


@pytest.mark.parametrize("transport,device_window", [("cuda_ipc", True), ("cuda_ipc", False),
                                                     ("shm", False), ("tcp", False)])
@pytest.mark.parametrize("n", [2, 3])
def test_device_memory_put_get_accumulate(transport, device_window, n):
    results = run_ranks(_device_window_ops, n, device_window, timeout=240,
                        env={"PYCOLL_TRANSPORTS": transport})
    blocks = np.concatenate([np.arange(N, dtype=np.float32) + 100 * (q + 1) for q in range(n)])
    tail = [3 * sum(q + 1 for q in range(n)) + n] * 4
    for r, (mine, got, got_tail) in enumerate(results):
        assert mine[:N * n] == blocks.tolist()
        assert got == blocks.tolist()
        if r == 0:
            assert got_tail == tail


def _device_refusals(comm):
    """Out of bounds and a wrong dtype, from and into device memory: refused on the caller,
    nothing written at the target or into the destination."""
    cp = _cp()
    window = cp.zeros(N, dtype=np.float64)
    errors = []
    with comm.window(window) as win:
        peer = 1 - comm.rank
        dst = cp.asarray(np.full(4, 7.0))
        def ones(n, dtype=np.float64):
            return cp.asarray(np.ones(n, dtype=dtype))
        for attempt in (lambda: win.put(ones(N + 1), peer),
                        lambda: win.put(ones(4), peer, offset=N - 3),
                        lambda: win.get(dst, peer, offset=N - 2),
                        lambda: win.accumulate(ones(2), peer, offset=-1),
                        lambda: win.put(ones(4, np.float32), peer)):
            try:
                attempt()
                errors.append(None)
            except (pycoll.InvalidArgument, pycoll.InvalidDtype) as e:
                errors.append((type(e).__name__, str(e)))
        win.fence()
        untouched = bool((_host(window) == 0).all()) and bool((_host(dst) == 7).all())
    return errors, untouched


def test_device_window_refuses_out_of_bounds_and_dtype_with_nothing_written():
    for errors, untouched in run_ranks(_device_refusals, 2, timeout=240,
                                       env={"PYCOLL_TRANSPORTS": "cuda_ipc"}):
        assert untouched is True
        kinds = [e[0] if e else None for e in errors]
        assert kinds == ["InvalidArgument"] * 4 + ["InvalidDtype"], errors
        assert all("nothing was moved" in e[1] for e in errors), errors


def _device_window_refused(comm):
    try:
        comm.window(_cp().zeros(N, dtype=np.float32))
    except pycoll.WindowError as e:
        return str(e)
    return None


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_device_window_over_a_host_transport_is_refused_on_every_rank(transport):
    for message in run_ranks(_device_window_refused, 2, timeout=120,
                             env={"PYCOLL_TRANSPORTS": transport}):
        assert message is not None and f"({transport}) cannot expose" in message, message
        assert "cuda_ipc" in message


def _released_device_target(comm):
    """Rank 1 leaves the window on an exception (no barrier): rank 0's operations on its
    device window fail naming it and write nothing."""
    cp = _cp()
    window = cp.zeros(N, dtype=np.float32)
    win = comm.window(window)
    comm.barrier()
    if comm.rank == 1:
        try:
            with win:
                raise RuntimeError("user code failed")
        except RuntimeError:
            pass
        comm.barrier()
        comm.barrier()
        return bool((_host(window) == 0).all())
    comm.barrier()
    errors = []
    for attempt in (lambda: win.put(cp.asarray(np.ones(N, dtype=np.float32)), 1),
                    lambda: win.accumulate(cp.asarray(np.ones(N, dtype=np.float32)), 1),
                    lambda: win.get(cp.zeros(N, dtype=np.float32), 1),
                    lambda: win.signal(1)):
        try:
            attempt()
            errors.append(None)
        except pycoll.PycollError as e:
            errors.append((e.peer, str(e)))
    comm.barrier()
    win.invalidate("the test ends")
    return errors


def test_released_device_window_refuses():
    errors, untouched = run_ranks(_released_device_target, 2, timeout=240,
                                  env={"PYCOLL_TRANSPORTS": "cuda_ipc"})
    assert untouched is True
    for error in errors:
        assert error is not None and error[0] == 1 and "target rank 1" in error[1], errors
