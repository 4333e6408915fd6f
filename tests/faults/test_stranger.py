"""A stranger on a rank's TCP data port does not disturb the job.

A rank's data port is open while its communicator lives (connections are lazy: a peer may
dial in at its first collective), and its address is published in the store: strangers that
send nothing, send garbage, present a wrong HMAC, or claim a rank with a forged proof are
dropped (silent ones at the handshake deadline), and the job still connects and computes the
right answer. After the job the port is closed: connecting is refused.
"""
from __future__ import annotations

import json
import os
import select
import socket
import struct
import threading
import time

import numpy as np
import pytest

from pycoll.testing import run_ranks

pytestmark = pytest.mark.timeout(60)


def _job(comm, port_file):
    if comm.rank == 0:
        addr = json.loads(comm._store.get("pycoll/world//hello/0"))["addr"]["tcp"]
        port_file_path = port_file
        with open(port_file_path, "w") as f:
            f.write(str(addr["port"]))
    a = np.full(1 << 16, comm.rank + 1, dtype=np.float32)
    comm.allreduce(a)
    comm.barrier()
    return float(a[0]), float(a[-1]), comm.transport_summary()


def _strangers(store_port, stop, log):
    """Connect to rank 0's data port as soon as it is published, in several bad ways."""
    from rendezvous import PrefixStore, TCPStore
    client = TCPStore("127.0.0.1", store_port, timeout=30)
    scoped = PrefixStore("pycoll/world/", client)
    addr = json.loads(scoped.get("hello/0", timeout=30))["addr"]["tcp"]
    target = (addr["host"], addr["port"])
    socks = []
    hello = struct.Struct("<8sIHH32s")     # magic, rank, stream, streams, proof
    payloads = {
        "silent": None,                                           # connects, sends nothing
        "garbage": os.urandom(hello.size),
        "wrong-magic": hello.pack(b"NOTPYCOL", 1, 0, 1, b"\0" * 32),
        "forged-proof": hello.pack(b"PYCOLLv2", 1, 0, 1, os.urandom(32)),   # claims rank 1
        "no-such-rank": hello.pack(b"PYCOLLv2", 1000, 0, 1, os.urandom(32)),  # rank >= world
        "bad-stream": hello.pack(b"PYCOLLv2", 1, 7, 2, os.urandom(32)),   # stream >= streams
        "many-streams": hello.pack(b"PYCOLLv2", 1, 0, 60000, os.urandom(32)),
        "short": b"PYCOLLv2",                                     # half a hello, then silence
    }
    for name, data in payloads.items():
        try:
            s = socket.create_connection(target, timeout=5)
            if data is not None:
                s.sendall(data)
            socks.append(s)
            log.append(name)
        except OSError as e:
            log.append(f"{name}: {e}")
    stop.wait(20)
    for s in socks:
        s.close()
    client.close()


def test_stranger_during_setup_is_dropped(tmp_path):
    # Rank 1 starts late, so rank 0's listener waits for it while the strangers knock.
    from pycoll import testing
    port_file = tmp_path / "port"
    stop = threading.Event()
    log: list[str] = []
    original = testing._rank_main

    def delayed(fn, rank, *args):   # runs in the forked rank
        if rank == 1:
            time.sleep(3.0)
        return original(fn, rank, *args)

    # Run the strangers against the store of the job that run_ranks starts: patch its server
    # start to learn the port.
    from rendezvous import StoreServer
    orig_start = StoreServer.start

    def start(self):
        out = orig_start(self)
        threading.Thread(target=_strangers, args=(self.port, stop, log), daemon=True).start()
        return out

    testing._rank_main = delayed
    StoreServer.start = start
    try:
        results = run_ranks(_job, 2, str(port_file), env={"PYCOLL_TRANSPORTS": "tcp"},
                            collective_timeout=20)
    finally:
        testing._rank_main = original
        StoreServer.start = orig_start
        stop.set()
    assert results == [(3.0, 3.0, "tcp")] * 2
    # Every stranger knocked; on a loaded machine the last ones may arrive after setup, when
    # the listener is already closed (connection refused or reset): that is fine too.
    names = ["silent", "garbage", "wrong-magic", "forged-proof", "no-such-rank", "bad-stream",
             "many-streams", "short"]
    assert [entry.split(":")[0] for entry in log] == names, log
    assert log[0] == "silent", log      # the first one did get in while setup waited
    # After the job the listener is closed: nobody can connect any more.
    port = int(port_file.read_text())
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _held_strangers(target, flood: int = 140) -> dict:
    """Connect to ``target`` as strangers (more silent ones than the listener's backlog, a
    half hello, garbage) and watch them from their side: how many could connect, and how
    many the listener still holds open (no EOF, no reset) well past its handshake deadline."""
    from pycoll.transports.wireup import HANDSHAKE_SECONDS
    socks, refused = [], 0
    payloads = [os.urandom(48), b"PYCOLLv2"] + [None] * flood
    for data in payloads:
        try:
            s = socket.create_connection(target, timeout=2.0)
        except OSError:     # the backlog is full: its holder does not accept
            refused += 1
            break
        if data is not None:
            s.sendall(data)
        s.setblocking(False)
        socks.append(s)
    poller = select.poll()
    for s in socks:
        poller.register(s, select.POLLIN)
    open_socks = {s.fileno(): s for s in socks}
    limit = time.monotonic() + HANDSHAKE_SECONDS + 20.0     # the promise, and generous slack
    while open_socks and time.monotonic() < limit:
        for fd, _ in poller.poll(500):
            try:
                if open_socks[fd].recv(1):
                    continue                    # the listener answered a stranger?
            except BlockingIOError:
                continue
            except OSError:
                pass                            # reset: dropped
            poller.unregister(fd)
            open_socks.pop(fd).close()
    held = len(open_socks)
    for s in open_socks.values():
        s.close()
    return {"connected": len(socks), "refused": refused, "held": held}


def _busy_rank_job(comm, flag):
    a = np.full(1024, comm.rank + 1, dtype=np.float32)
    comm.allreduce(a)       # set up: rank 0's data port stays open, for peers dialing later
    outcome = None
    if comm.rank == 0:
        # busy in user code, no pycoll call (so no progress) until rank 1 is done knocking
        limit = time.monotonic() + 90.0
        while not os.path.exists(flag) and time.monotonic() < limit:
            time.sleep(0.05)
    else:
        addr = json.loads(comm._store.get("pycoll/world//hello/0"))["addr"]["tcp"]
        try:
            outcome = _held_strangers((addr["host"], addr["port"]))
        finally:
            open(flag, "w").close()
    b = np.full(1024, comm.rank + 1, dtype=np.float32)
    comm.allreduce(b)
    comm.barrier()
    return float(b[0]), outcome


@pytest.mark.timeout(150)
def test_strangers_dropped_while_the_rank_is_busy(tmp_path):
    """After setup rank 0 sleeps in user code; strangers knock on its data port (a flood of
    silent ones beyond the backlog, half a hello, garbage). Every one gets in and is
    closed, seen from the stranger's side, within the handshake deadline and generous
    slack, whatever rank 0 is doing; then the job's next collective works."""
    results = run_ranks(_busy_rank_job, 2, str(tmp_path / "done"),
                        env={"PYCOLL_TRANSPORT": "tcp"}, timeout=140, collective_timeout=100)
    assert [r[0] for r in results] == [3.0, 3.0]
    assert results[1][1] == {"connected": 142, "refused": 0, "held": 0}, results[1][1]
