"""Strangers at a rank's listening port (the tcp data port, the verbs setup port): the
hostile-input tests knock with these while a job runs.

Every knock is bounded: a connect that finds the backlog full (a listener whose owner does
not accept) gives up after ``connect_timeout``, and the whole knocking stops after
``seconds``, so a test's rank never waits on its own strangers.
"""
from __future__ import annotations

import os
import socket
import struct
import time

#: ``transports.wireup.HELLO``: magic, rank, stream, streams, proof
HELLO = struct.Struct("<8sIHH32s")


def knock(target: tuple[str, int], flood: int = 260, seconds: float = 3.0,
          connect_timeout: float = 1.0, hold: float = 1.0) -> int:
    """Connect to ``target`` as strangers: garbage, a forged proof claiming rank 1, a proof
    made for another listener's nonce (a rank of an earlier job replaying its handshake),
    then ``flood`` silent connections (more than ``wireup.MAX_HANDSHAKES``: the acceptor
    drops the oldest). Keep them open ``hold`` seconds; return how many got in."""
    from ..transports.wireup import MAGIC, proof
    payloads: list[bytes | None] = [
        os.urandom(HELLO.size),
        HELLO.pack(MAGIC, 1, 0, 1, os.urandom(32)),
        HELLO.pack(MAGIC, 1, 0, 1, proof(None, "0" * 32, 1, 0, 1)),
    ]
    payloads += [None] * flood
    socks = []
    stop = time.monotonic() + seconds
    try:
        for data in payloads:
            if time.monotonic() > stop:
                break
            try:
                s = socket.create_connection(target, timeout=connect_timeout)
            except OSError:
                continue
            socks.append(s)
            if data is not None:
                s.sendall(data)
        time.sleep(hold)
        return len(socks)
    finally:
        for s in socks:
            s.close()
