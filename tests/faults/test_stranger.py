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
