"""The verbs transport end to end, on a real RDMA device (Soft-RoCE in the rdma-lab VM).

Run them with ``bash tests/verbs/run_in_vm.sh`` (boots the VM once for all of them; CI does
this). On a machine without a usable RDMA device every test here skips, saying why; the
transport-level cases live in ``tests/transports/test_conformance.py`` (variants ``verbs*``).

* a sampled collectives matrix over verbs on 2, 3 and 4 ranks (every collective and
  algorithm, eager and rendezvous sizes, counts not divisible by the world size);
* proof that the bytes went over RDMA: the device's packet counters rise by at least the
  payload over the MTU, no tcp transport is open, and the setup sockets carried a few hundred
  bytes while megabytes moved;
* kill -9 of a rank during allreduce and broadcast: every survivor names it, promptly;
* per-peer fallback: a rank whose device is excluded talks tcp to everyone, the others verbs
  among themselves, all ranks agreeing; ``PYCOLL_DEBUG=INFO`` logs the choice.
"""
from __future__ import annotations

import os
import socket
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from pycoll.testing import run_ranks
from pycoll.testing.faults import kill_during
from pycoll.transports.verbs.device import probe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "algorithms"))
from test_matrix import _check, _count_cases, _dtype_op_cases  # noqa: E402

RECORD, WHY = probe()
pytestmark = pytest.mark.skipif(RECORD is None, reason=f"verbs is not usable here: {WHY}; "
                                "run tests/verbs/run_in_vm.sh (Soft-RoCE VM)")
VERBS = {"PYCOLL_TRANSPORTS": "verbs"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_collectives_matrix_sampled(n):
    """Every collective x algorithm x form on eager and rendezvous sizes (count 4099 of
    float32/float64 is 16-32 KiB: around the eager limit; 70001 elements: rendezvous, striped
    over the data queue pairs), plus the dtype x op sample of the main matrix."""
    cases = _count_cases(n, [0, 1, 97, 4099], [("float32", "sum"), ("int64", "bxor"),
                                               ("float64", "max")])
    cases += _count_cases(n, [70_001], [("float32", "avg")],
                          ("allreduce", "reduce_scatter", "broadcast", "allgather"))
    cases += _dtype_op_cases(n)[:40]
    _check(n, cases, env=VERBS, timeout=280.0)


# -- proof that the bytes went over RDMA ----------------------------------------------------------
def _counters() -> dict[str, int]:
    device, port = RECORD["device"].split(":")
    base = Path(f"/sys/class/infiniband/{device}/ports/{port}/hw_counters")
    return {name: int((base / name).read_text()) for name in ("sent_pkts", "rcvd_pkts")
            if (base / name).exists()}


def _tcp_bytes(sock: socket.socket) -> int:
    """Bytes this socket sent and received (tcp_info's bytes_acked and bytes_received)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    acked, received = struct.unpack_from("<QQ", info, 120)
    return acked + received


def _move_megabytes(comm):
    data = np.full(4 << 20, comm.rank + 1, dtype=np.float32)     # 16 MiB
    for _ in range(3):
        comm.allreduce(data)
    t = comm._conn.transports
    verbs = t["verbs"]
    setup_bytes = sum(_tcp_bytes(ch._sock) for ch in verbs._channels.values()
                      if ch._sock is not None)
    return (float(data[0]), sorted(t), comm.transport_summary(), setup_bytes,
            verbs.stats())


def test_bytes_travel_over_rdma_not_tcp():
    before = _counters()
    results = run_ranks(_move_megabytes, 2, env=VERBS, timeout=200)
    after = _counters()
    for value, opened, summary, setup_bytes, cache in results:
        assert value == 12.0        # (1 + 2), then doubled twice
        assert opened == ["verbs"], opened
        assert "verbs" in summary and "tcp" not in summary, summary
        assert setup_bytes < 2048, f"the setup socket carried {setup_bytes} bytes"
        assert cache["hits"] > 0, cache          # the same tensor again: registered once
    # 3 allreduces of 16 MiB on 2 ranks move >= 3 x 16 MiB each way; rxe counts packets of at
    # most one MTU (<= 4 KiB) each
    moved = 3 * (16 << 20)
    assert before and after, "rxe0 exposes no hw_counters"
    assert after["sent_pkts"] - before["sent_pkts"] >= moved // 4096, (before, after)


# -- a dead peer ----------------------------------------------------------------------------------
CASES = [(w, c, n) for w in (2, 3, 4) for c, n in (("allreduce", 8), ("broadcast", 4 << 20))]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world,collective,nbytes", CASES,
                         ids=[f"w{w}-{c}-{n}B" for w, c, n in CASES])
def test_kill_9_is_named_by_every_survivor(world, collective, nbytes, tmp_path):
    victim = world - 1
    result = kill_during(world, collective, nbytes, victim=victim, transport="verbs",
                         env={"PYCOLL_TRACE_DIR": str(tmp_path)}, deadline=120.0, wait=60.0)
    assert len(result.survivors) == world - 1
    # under TCG emulation everything is 10-15x slower: a bound far below the 120 s deadline
    assert result.misblamed(within=40.0) == []
    assert result.still_running() == []


# -- per-peer fallback ----------------------------------------------------------------------------
def _choices(comm):
    data = np.full(70_001, comm.rank + 1.0, dtype=np.float64)   # rendezvous-sized
    comm.allreduce(data)
    return [comm.transport_of(p) if p != comm.rank else None for p in range(comm.size)], \
        float(data[0])


def test_a_rank_without_the_device_falls_back_to_tcp_for_its_pairs(capfd):
    device = RECORD["device"].split(":")[0]
    env = {"PYCOLL_TRANSPORTS": "verbs,tcp", "PYCOLL_DEBUG": "INFO"}
    results = run_ranks(_choices, 3, env=env, timeout=200,
                        rank_env={2: {"PYCOLL_IB_HCA": f"^{device}"}})
    want = [[None, "verbs", "tcp"], ["verbs", None, "tcp"], ["tcp", "tcp", None]]
    assert [r[0] for r in results] == want
    assert all(r[1] == 6.0 for r in results)
    err = capfd.readouterr().err
    assert "over verbs" in err and "over tcp" in err, err[-2000:]


def _nothing(comm):
    return None


def test_forcing_verbs_with_the_device_excluded_names_the_reason():
    device = RECORD["device"].split(":")[0]
    env = {"PYCOLL_TRANSPORTS": "verbs", "PYCOLL_IB_HCA": f"^{device}"}
    for kind, text in run_ranks(_nothing, 2, env=env, expect_failure=True):
        assert kind == "InvalidArgument", (kind, text)
        assert "verbs" in text and "excluded" in text and "PYCOLL_IB_HCA" in text, text


if os.environ.get("RDMA_LAB") and RECORD is None:   # inside the VM the device must be there
    raise RuntimeError(f"rdma-lab VM without a usable RDMA device: {WHY}")


# -- memory the transport holds (pycoll.bench --memory) ------------------------------------------
def _held_after(comm, count):
    """held_memory() before any call, after an eager and after a rendezvous allreduce."""
    before = comm.held_memory().get("verbs", {"segment": 0, "registered": 0})
    small = np.ones(16, dtype=np.float32)
    comm.allreduce(small)
    eager = comm.held_memory()["verbs"]
    big = np.ones(count, dtype=np.float32)
    comm.allreduce(big)
    after = comm.held_memory()["verbs"]
    return before, eager, after, float(big[0])


@pytest.mark.timeout(120)
def test_held_memory_counts_registered_bytes():
    """Over verbs nothing is shared memory, everything is registered: the channel's rings
    and slots once it opens (the first call), and the registration cache once a 4 MiB
    allreduce registered its buffers for the zero-copy rendezvous (they stay cached)."""
    count = 1 << 20
    for before, eager, after, value in run_ranks(_held_after, 2, count, env=VERBS,
                                                 timeout=110):
        assert value == 2.0
        assert before["segment"] == eager["segment"] == after["segment"] == 0
        assert before["registered"] < eager["registered"], (before, eager)
        assert after["registered"] > eager["registered"], (eager, after)
