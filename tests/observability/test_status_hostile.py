"""Hostile input on a rank's status port, as tests/rdzv/test_rdzv_hostile.py does to the store:
garbage, truncated and oversized frames, a flood of idle connections, slow clients and wrong
secrets each cost a closed connection; the port keeps answering legitimate queries, and a
job under attack finishes with correct results."""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pycoll.comm import status
from rendezvous import protocol as P

from .test_status import TOKEN, Job, _all_done

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def responder() -> Iterator[status.Responder]:
    r = status.Responder("127.0.0.1", TOKEN, lambda: {"communicators": [{"name": "x"}]})
    try:
        yield r
    finally:
        assert r.running, "the responder's thread died"
        r.close()


def _healthy(host: str, port: int) -> None:
    answer, sent, came = status.query(host, port, TOKEN, 30.0)
    assert answer["communicators"] and sent <= came


def _closed(sock: socket.socket, deadline: float = 30.0) -> bool:
    """Whether the other end closes ``sock`` (reading and dropping what it sends)."""
    sock.settimeout(deadline)
    end = time.monotonic() + deadline
    try:
        while time.monotonic() < end:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def _hello(sock: socket.socket) -> bytes:
    """Read the responder's first frame; its nonce."""
    sock.settimeout(30)
    buf = b""
    while len(buf) < 4 or len(buf) < 4 + P.FRAME_HEADER.unpack_from(buf)[0]:
        buf += sock.recv(4096)
    _code, _arg, blobs = P.decode_message(buf[4:])
    return blobs[1]


def test_garbage_truncated_and_oversized_frames(responder: status.Responder) -> None:
    host, port = responder.host, responder.port
    rng = random.Random(42)
    for i in range(30):
        with socket.create_connection((host, port)) as s:
            try:
                s.sendall(rng.randbytes(rng.randint(1, 4096)))
            except OSError:
                pass
            assert _closed(s), f"attempt {i}: garbage left open"
    with socket.create_connection((host, port)) as s:       # a frame bigger than any request
        s.sendall(P.FRAME_HEADER.pack(1 << 30) + b"x" * 100)
        assert _closed(s)
    with socket.create_connection((host, port)) as s:       # well framed, not a request
        _hello(s)
        s.sendall(P.encode_message(99, 0, [b"a", b"b"]))
        assert _closed(s)
    for cut in (1, 3, 10):                                   # truncated, then hung up
        with socket.create_connection((host, port)) as s:
            nonce = _hello(s)
            frame = P.encode_message(status.OP_STATUS, 0, [b"c" * 32, P.client_mac(
                TOKEN.encode(), nonce, b"c" * 32, status.SERVICE)])
            s.sendall(frame[:cut])
    _healthy(host, port)


def test_wrong_secret_is_refused(responder: status.Responder) -> None:
    for token in ("wrong", None, ""):
        with pytest.raises(status.Refused, match="secret"):
            status.query(responder.host, responder.port, token, 30.0)
    # a proof made for the store's service is no proof here
    with socket.create_connection((responder.host, responder.port)) as s:
        nonce = _hello(s)
        cn = b"n" * 32
        s.sendall(P.encode_message(status.OP_STATUS, 0, [cn, P.client_mac(TOKEN.encode(),
                                                                          nonce, cn)]))
        buf = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        assert P.decode_message(buf[4:])[0] == P.Status.ERROR
    _healthy(responder.host, responder.port)


def test_idle_flood_and_slow_clients(responder: status.Responder) -> None:
    host, port = responder.host, responder.port
    flood = []
    try:
        for _ in range(3 * status.MAX_CONNECTIONS):
            flood.append(socket.create_connection((host, port)))
        _healthy(host, port)        # the oldest idle ones made room
        slow = socket.create_connection((host, port))
        with slow:
            nonce = _hello(slow)
            frame = P.encode_message(status.OP_STATUS, 0, [b"s" * 32, P.client_mac(
                TOKEN.encode(), nonce, b"s" * 32, status.SERVICE)])
            for b in frame[:5]:                    # a byte now and then, never the whole
                slow.sendall(bytes([b]))
                _healthy(host, port)               # others are answered meanwhile
            assert _closed(slow, status.CONNECTION_SECONDS * 6), "a slow client kept its slot"
    finally:
        for s in flood:
            s.close()
    _healthy(host, port)


def _rank0(j: Job) -> tuple[str, int]:
    report = j.poll(lambda r: r["ranks"][0].get("address") is not None)
    host, port = report["ranks"][0]["address"].rsplit(":", 1)
    return host, int(port)


def test_a_job_under_attack_finishes_correctly(tmp_path: Path) -> None:
    j = Job(tmp_path)
    try:
        host, port = _rank0(j)
        rng = random.Random(7)
        socks: list[Any] = []
        for _ in range(100):
            socks.append(socket.create_connection((host, port)))
        for _ in range(20):
            with socket.create_connection((host, port)) as s:
                s.sendall(rng.randbytes(rng.randint(1, 2048)))
        with pytest.raises(status.Refused):
            status.query(host, port, "wrong", 30.0)
        _healthy(host, port)
        report = j.report()
        assert report is not None and report["ranks"][0]["state"] in ("in_collective",
                                                                      "outside")
        for s in socks:
            s.close()
        _all_done(j.finish())
    finally:
        j.close()


def test_sixty_four_ports_answer_at_once() -> None:
    """64 status ports (threads of this process, each a real socket and thread) behind a
    real store: the tool asks them all at once; what it took is printed, not asserted."""
    from rendezvous import StoreServer, TCPStore

    def describe(rank: int) -> Any:
        return lambda: {"rank": rank, "transport": "shm", "communicators": [{
            "name": "world", "rank": rank, "size": 64, "seq": 7, "p2p_seq": 0,
            "now": time.monotonic(), "state": "outside", "outside_s": 0.001,
            "after": {"collective": "allreduce", "seq": 7}, "last_completed_seq": 7,
            "last_completed": "allreduce", "calls_per_s": 1.0, "bytes_per_s": 8.0,
            "arrivals": [[s, "allreduce", 100.0 + s + (0.01 if rank == 9 else 0.0)]
                         for s in range(1, 41)]}]}

    server = StoreServer("127.0.0.1", 0, token=TOKEN).start()
    ports = [status.Responder("127.0.0.1", TOKEN, describe(r)) for r in range(64)]
    try:
        with TCPStore("127.0.0.1", server.port, token=TOKEN, timeout=30) as store:
            for r, p in enumerate(ports):
                store.set(status.status_key("world", r), json.dumps(
                    {"host": p.host, "port": p.port, "pid": 0, "hostname": "h",
                     "boot_id": status.boot_id(), "size": 64}))
        took = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-m", "pycoll.status",
                                  f"127.0.0.1:{server.port}", "--json"], capture_output=True,
                                 text=True, timeout=120,
                                 env={**os.environ, "PYCOLL_TOKEN": TOKEN})
            assert out.returncode == 0, out.stderr
            report = json.loads(out.stdout)
            assert [r["state"] for r in report["ranks"]] == ["outside"] * 64
            took.append(report["took_s"])
        # the arrivals say rank 9 starts every call 10 ms late (one kernel: offsets 0)
        assert [(s["rank"], s["late_fraction"]) for s in report["stragglers"]] == [(9, 1.0)]
        print(f"64 ports: status took {sorted(took)} s")
    finally:
        for p in ports:
            p.close()
        server.close()


def test_a_status_port_without_a_secret_reachable_from_other_hosts_is_warned_of():
    """No PYCOLL_TOKEN means the empty HMAC key: a port on an address other hosts reach then
    answers anyone there, which the rank says at start (the loopback, or a secret: silent)."""
    from pycoll.comm.status import unauthenticated_warning
    said = unauthenticated_warning("10.1.2.3", None, 3)
    assert said is not None and "rank 3" in said and "PYCOLL_TOKEN" in said, said
    assert unauthenticated_warning("10.1.2.3", "", 3) is not None
    assert unauthenticated_warning("10.1.2.3", "secret", 3) is None
    for loopback in ("127.0.0.1", "127.0.1.1", "::1", "localhost"):
        assert unauthenticated_warning(loopback, None, 3) is None, loopback
