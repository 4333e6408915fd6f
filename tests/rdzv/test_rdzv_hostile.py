"""Hostile input: the server closes the offending connection, logs it, and keeps serving."""

from __future__ import annotations

import logging
import random
import signal
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from rdzv_util import (
    HOST,
    cli_server,
    finish,
    raw_connect,
    raw_login,
    reaped,
    recv_frame,
    spawn,
    wait_closed,
    wait_until,
)

from rendezvous import StoreServer, TCPStore
from rendezvous import protocol as P

pytestmark = pytest.mark.timeout(60)

TOKEN = b"hostile-test-token"


@pytest.fixture
def hserver(caplog: pytest.LogCaptureFixture) -> Iterator[StoreServer]:
    caplog.set_level(logging.WARNING, logger="rendezvous.server")
    srv = StoreServer(HOST, 0, handshake_timeout=1.0, max_value_size=1 << 16).start()
    try:
        yield srv
    finally:
        assert srv._thread is not None and srv._thread.is_alive(), "server thread died"
        srv.close()


def _healthy(port: int, token=None) -> None:
    """A legitimate client on a fresh connection can still do real work."""
    with TCPStore(HOST, port, token=token, timeout=10) as s:
        n = s.add("health", 1)
        s.set(f"h/{n}", str(n))
        assert s.multi_get([f"h/{n}"]) == [str(n).encode()]


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


def test_random_bytes_before_handshake(hserver: StoreServer,
                                       caplog: pytest.LogCaptureFixture) -> None:
    legit = TCPStore(HOST, hserver.port, timeout=10)  # connected before and during the attack
    rng = random.Random(1234)
    for i in range(30):
        sock, _ = raw_connect(hserver.port)
        with sock:
            try:
                sock.sendall(rng.randbytes(rng.randint(1, 4096)))
            except OSError:
                pass  # the server may already have closed it
            assert wait_closed(sock, 10), f"attempt {i}: hostile connection not closed"
        legit.set(f"during/{i}", "ok")
    assert legit.get("during/29") == b"ok"
    legit.close()
    _healthy(hserver.port)
    assert _logged(caplog, "closing connection from")


def test_random_frames_after_handshake(hserver: StoreServer,
                                       caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(99)
    closed = 0
    for _i in range(40):
        sock = raw_login(hserver.port)
        with sock:
            body = rng.randbytes(rng.randint(0, 200))
            try:
                sock.sendall(P.FRAME_HEADER.pack(len(body)) + body)
            except OSError:
                pass
            # A random body is almost always malformed -> closed; a rare valid parse gets a reply.
            sock.settimeout(10)
            try:
                data = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                data = b""
            if not data or wait_closed(sock, 0.05):
                closed += 1
        _healthy(hserver.port)
    assert closed >= 30
    assert _logged(caplog, "malformed request") or _logged(caplog, "unknown command")


def test_truncated_frames(hserver: StoreServer, caplog: pytest.LogCaptureFixture) -> None:
    # Handshake frame cut short, then the client vanishes.
    sock, _ = raw_connect(hserver.port)
    sock.sendall(P.FRAME_HEADER.pack(40) + b"\x00" * 10)
    sock.close()
    # Request frame cut short after a valid handshake, then the client vanishes.
    sock = raw_login(hserver.port)
    msg = P.encode_message(P.Op.SET, 0, [b"key", b"value" * 10])
    sock.sendall(msg[: len(msg) // 2])
    sock.close()
    # Request frame cut short and the client stays connected, silent: others unaffected.
    lurker = raw_login(hserver.port)
    lurker.sendall(msg[:7])
    _healthy(hserver.port)
    # A header announcing a frame bigger than the data, with consistent inner lengths missing.
    bogus = raw_login(hserver.port)
    bogus.sendall(P.FRAME_HEADER.pack(13) + struct.pack(">BqI", P.Op.MULTI_GET, 0, 1000))
    assert wait_closed(bogus, 10)
    bogus.close()
    assert wait_until(lambda: _logged(caplog, "truncated"), 10)
    _healthy(hserver.port)
    lurker.close()


@pytest.mark.parametrize("authenticated", [False, True])
def test_oversized_length_closes_at_once(
    hserver: StoreServer, caplog: pytest.LogCaptureFixture, authenticated: bool
) -> None:
    for announced in (0xFFFFFFFF, hserver.max_frame_size + 1, P.MAX_HANDSHAKE_FRAME + 1):
        if authenticated and announced <= hserver.max_frame_size:
            continue
        sock = raw_login(hserver.port) if authenticated else raw_connect(hserver.port)[0]
        with sock:
            # Only the header is sent: the server must not wait for 4 GiB to arrive.
            sock.sendall(P.FRAME_HEADER.pack(announced) + b"xx")
            assert wait_closed(sock, 10)
    assert _logged(caplog, "oversized")
    _healthy(hserver.port)


def test_unknown_command_and_bad_arity(hserver: StoreServer,
                                       caplog: pytest.LogCaptureFixture) -> None:
    sock = raw_login(hserver.port)
    with sock:
        sock.sendall(P.encode_message(200, 0, [b"x"]))
        status, _, blobs = P.decode_message(recv_frame(sock))
        assert status == P.Status.ERROR and b"unknown command" in blobs[0]
        assert wait_closed(sock, 10)
    sock = raw_login(hserver.port)
    with sock:
        sock.sendall(P.encode_message(P.Op.SET, 0, [b"only-key"]))  # SET needs key and value
        assert wait_closed(sock, 10)
    sock = raw_login(hserver.port)
    with sock:
        sock.sendall(P.encode_message(P.Op.MULTI_SET, 0, [b"a", b"b", b"c"]))  # odd count
        assert wait_closed(sock, 10)
    assert _logged(caplog, "unknown command") and _logged(caplog, "expects")
    _healthy(hserver.port)


def test_bad_magic_and_garbage_handshake(hserver: StoreServer,
                                         caplog: pytest.LogCaptureFixture) -> None:
    sock, _ = raw_connect(hserver.port)
    with sock:
        login = P.LOGIN_FIXED.pack(0xDEADBEEF, P.VERSION, b"\x00" * 32, 0)
        sock.sendall(P.FRAME_HEADER.pack(len(login)) + login)
        assert wait_closed(sock, 10)
    sock, _ = raw_connect(hserver.port)
    with sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # a stray HTTP probe
        assert wait_closed(sock, 10)
    assert _logged(caplog, "bad magic") or _logged(caplog, "oversized handshake")
    _healthy(hserver.port)


def test_silent_clients_do_not_block_and_are_dropped(
    hserver: StoreServer, caplog: pytest.LogCaptureFixture
) -> None:
    silent = [socket.create_connection((HOST, hserver.port), timeout=10) for _ in range(50)]
    try:
        # While 50 connections sit in the handshake saying nothing, real clients are served.
        _healthy(hserver.port)
        with TCPStore(HOST, hserver.port, timeout=10) as s:
            s.set("x", "1")
        # After handshake_timeout (1 s) the unauthenticated idle connections are dropped.
        for sock in silent:
            assert wait_closed(sock, 15)
        assert _logged(caplog, "no handshake within")
    finally:
        for sock in silent:
            sock.close()
    # An *authenticated* idle client is fine and stays connected.
    with TCPStore(HOST, hserver.port, timeout=10) as idle:
        time.sleep(1.5)
        idle.set("still", "here")
        assert idle.get("still") == b"here"


def test_wrong_tokens_and_replayed_login(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rendezvous.server")
    srv = StoreServer(HOST, 0, token=TOKEN, handshake_timeout=1.0).start()
    try:
        # A login MAC computed for one connection's nonce is useless on another (replay).
        sock, snonce = raw_connect(srv.port)
        cnonce = b"\x01" * 32
        mac = P.client_mac(TOKEN, snonce, cnonce)
        login = P.LOGIN_FIXED.pack(P.MAGIC, P.VERSION, cnonce, len(mac)) + mac
        sock.sendall(P.FRAME_HEADER.pack(len(login)) + login)
        assert P.WELCOME_FIXED.unpack_from(recv_frame(sock), 0)[0] == P.WelcomeStatus.OK
        sock.close()
        replay, _ = raw_connect(srv.port)
        with replay:
            replay.sendall(P.FRAME_HEADER.pack(len(login)) + login)
            assert P.WELCOME_FIXED.unpack_from(recv_frame(replay), 0)[0] == \
                P.WelcomeStatus.AUTH_FAILED
            assert wait_closed(replay, 10)
        # Commands before authentication are never executed.
        early, _ = raw_connect(srv.port)
        with early:
            early.sendall(P.encode_message(P.Op.SET, 0, [b"pwned", b"1"]))
            assert wait_closed(early, 10)
        for i in range(20):
            sock, snonce = raw_connect(srv.port)
            with sock:
                mac = P.client_mac(b"wrong%d" % i, snonce, cnonce)
                login = P.LOGIN_FIXED.pack(P.MAGIC, P.VERSION, cnonce, len(mac)) + mac
                sock.sendall(P.FRAME_HEADER.pack(len(login)) + login)
                assert wait_closed(sock, 10)
        assert sum("authentication failed" in r.getMessage() for r in caplog.records) >= 21
        _healthy(srv.port, token=TOKEN)
        with TCPStore(HOST, srv.port, token=TOKEN, timeout=10) as s:
            assert not s.check(["pwned"])
    finally:
        assert srv._thread is not None and srv._thread.is_alive()
        srv.close()


def test_flooding_while_parked_is_cut_off(hserver: StoreServer,
                                          caplog: pytest.LogCaptureFixture) -> None:
    sock = raw_login(hserver.port)
    with sock:
        sock.sendall(P.encode_message(P.Op.GET, 30000, [b"never"]))  # parks the connection
        junk = P.encode_message(P.Op.SET, 0, [b"k", b"v" * 60000])
        sent_ok = True
        try:
            for _ in range(200):  # ~12 MB pipelined behind a parked request
                sock.sendall(junk)
        except OSError:
            sent_ok = False
        assert wait_closed(sock, 15) or not sent_ok
    assert _logged(caplog, "flooding")
    _healthy(hserver.port)


def test_standalone_server_survives_garbage_and_exits_cleanly() -> None:
    with cli_server("--handshake-timeout", "1") as (proc, port):
        attack = spawn(
            """
            import random, socket, struct
            port = int(sys.argv[1]); rng = random.Random(7)
            for i in range(100):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                try:
                    s.sendall(rng.choice([
                        rng.randbytes(rng.randint(1, 3000)),
                        struct.pack(">I", 0xFFFFFFF0),
                        struct.pack(">I", 50) + b"abc",
                        b"",
                    ]))
                except OSError:
                    pass
                s.close()
            print("attack done")
            """,
            port,
        )
        worker = spawn(
            """
            s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
            for i in range(200):
                s.set(f"w/{i}", str(i)); assert s.get(f"w/{i}") == str(i).encode()
            print(s.add("w/done", 1))
            """,
            port,
        )
        with reaped(attack, worker):
            rc, out, err = finish(attack, 60)
            assert rc == 0, err
            rc, out, err = finish(worker, 60)
            assert rc == 0 and out.strip() == "1", err
        _healthy(port)
        proc.send_signal(signal.SIGTERM)
        rc, _, err = finish(proc, 20)
        assert rc == 0
        assert "Traceback" not in err
        assert "closing connection from" in err
