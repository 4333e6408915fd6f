"""The store over TLS (``rendezvous.tls``): a TLS server and its clients, every mismatch
refused at once with what to set, strangers dropped, and the bytes on the wire (read by a
relay between client and server) not in the clear."""
from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from pycoll.testing.certs import make_job_certificates, openssl_available
from rendezvous import AuthError, StoreServer, TCPStore
from rendezvous.tls import TlsConfigError, TlsFiles, tls_from_env

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not openssl_available(), reason="no openssl command")]

HOST = "127.0.0.1"
MARKER = b"STORE-CLEARTEXT-MARKER-"


def _files(env: dict[str, str]) -> TlsFiles:
    return TlsFiles(env["PYCOLL_TLS_CERT"], env["PYCOLL_TLS_KEY"], env["PYCOLL_TLS_CA"])


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, TlsFiles]:
    root = tmp_path_factory.mktemp("store-tls")
    job = make_job_certificates(root / "job", ["server", "client"])
    other = make_job_certificates(root / "other", ["stranger"], ca_name="another-ca")
    files = {name: _files(env) for name, env in {**job, **other}.items()}
    # a job certificate that trusts only the other CA; another CA's certificate trusting ours
    files["wrong-ca"] = TlsFiles(files["client"].cert, files["client"].key, files["stranger"].ca)
    files["foreign-cert"] = TlsFiles(files["stranger"].cert, files["stranger"].key,
                                     files["client"].ca)
    return files


@pytest.fixture
def server(certs, monkeypatch) -> Iterator[StoreServer]:
    for name in ("PYCOLL_TLS_CERT", "PYCOLL_TLS_KEY", "PYCOLL_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    srv = StoreServer(HOST, 0, token="s3cret", tls=certs["server"], handshake_timeout=2.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def test_round_trip_large_values_and_parked_waits(server, certs):
    a = TCPStore(HOST, server.port, token="s3cret", tls=certs["client"], timeout=10)
    b = TCPStore(HOST, server.port, token="s3cret", tls=certs["client"], timeout=10)
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.append(b.get("late", timeout=10)))
    waiter.start()
    big = bytes(range(256)) * (5 << 12)                   # 5 MiB: hundreds of TLS records
    a.set("big", big)
    a.set("late", b"here")
    waiter.join(15)
    assert got == [b"here"]
    assert b.get("big") == big
    assert a.add("n", 2) == 2 and b.add("n", 3) == 5
    assert a.multi_get(["big", "late"]) == [big, b"here"]
    assert isinstance(a._sock, ssl.SSLSocket) and a._sock.version() == "TLSv1.3"
    a.close()
    b.close()


@pytest.mark.parametrize("who, words", [
    ("plain", ["requires TLS", "no certificates", "PYCOLL_TLS_CA"]),
    ("wrong-ca", ["not signed by this process's CA", "PYCOLL_TLS_CA"]),
    ("foreign-cert", ["refused this process's certificate", "PYCOLL_TLS_CA"]),
])
def test_a_client_that_cannot_speak_tls_with_the_store_is_refused_at_once(
        server, certs, who, words):
    tls = False if who == "plain" else certs[who]
    start = time.monotonic()
    with pytest.raises(AuthError) as e:
        TCPStore(HOST, server.port, token="s3cret", tls=tls, timeout=30)
    assert time.monotonic() - start < 10          # refused, not retried until the deadline
    for word in words + [f"{HOST}:{server.port}"]:
        assert word in str(e.value), str(e.value)
    ok = TCPStore(HOST, server.port, token="s3cret", tls=certs["client"], timeout=10)
    ok.set("still", b"serving")                    # the server is unaffected
    assert ok.get("still") == b"serving"
    ok.close()


def test_a_tls_client_refuses_a_plain_store(certs):
    with StoreServer(HOST, 0, token="s3cret", tls=False) as plain:
        plain.start()
        with pytest.raises(AuthError, match="does not speak TLS"):
            TCPStore(HOST, plain.port, token="s3cret", tls=certs["client"], timeout=10)


def test_strangers_are_dropped_and_the_store_keeps_serving(server, certs):
    silent = socket.create_connection((HOST, server.port), timeout=5)
    garbage = socket.create_connection((HOST, server.port), timeout=5)
    garbage.sendall(b"\x16\x03\x01\x00\x05hello" + b"\x00" * 100)   # a broken ClientHello
    client = TCPStore(HOST, server.port, token="s3cret", tls=certs["client"], timeout=10)
    client.set("k", b"v")
    for s in (garbage, silent):           # garbage at once, silence at handshake_timeout
        s.settimeout(10)
        data = s.recv(4096)               # the plain notice (and maybe an alert), then EOF
        while data:
            try:
                data = s.recv(4096)
            except ConnectionResetError:
                break
        s.close()
    assert client.get("k") == b"v"
    client.close()


class Relay:
    """Forwards one TCP connection to the server and keeps every byte it forwarded."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server((HOST, 0))
        self.seen = bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                self.seen += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _run(self) -> None:
        self.listener.settimeout(20)
        conn, _ = self.listener.accept()
        upstream = socket.create_connection((HOST, self.port), timeout=20)
        conn.settimeout(20)
        back = threading.Thread(target=self._pump, args=(upstream, conn), daemon=True)
        back.start()
        self._pump(conn, upstream)
        back.join(20)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(20)


@pytest.mark.parametrize("tls", [True, False])
def test_values_are_not_in_the_clear_on_the_wire(certs, tls):
    server_tls = certs["server"] if tls else False
    with StoreServer(HOST, 0, token="s3cret", tls=server_tls) as srv:
        srv.start()
        relay = Relay(srv.port)
        client = TCPStore(HOST, relay.listener.getsockname()[1], token="s3cret",
                          tls=certs["client"] if tls else False, timeout=10)
        client.set("secret-key", MARKER * 100)
        assert client.get("secret-key") == MARKER * 100
        client.close()
        relay.close()
    assert len(relay.seen) > 2 * len(MARKER) * 100        # the value crossed the relay
    assert (MARKER in relay.seen) is not tls               # in the clear only without TLS
    assert (b"secret-key" in relay.seen) is not tls


def test_the_environment_selects_tls_all_or_nothing(certs, monkeypatch, tmp_path):
    job = certs["client"]
    monkeypatch.setenv("PYCOLL_TLS_CERT", job.cert)
    for name in ("PYCOLL_TLS_KEY", "PYCOLL_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(TlsConfigError, match="PYCOLL_TLS_KEY, PYCOLL_TLS_CA not"):
        tls_from_env()
    with pytest.raises(TlsConfigError):
        StoreServer(HOST, 0)
    monkeypatch.setenv("PYCOLL_TLS_KEY", job.key)
    monkeypatch.setenv("PYCOLL_TLS_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(TlsConfigError, match="PYCOLL_TLS_CA=.*missing.pem.*no such file"):
        tls_from_env()
    monkeypatch.setenv("PYCOLL_TLS_CA", job.ca)
    assert tls_from_env() == job
    with StoreServer(HOST, 0, token="t") as srv:          # both from the environment
        srv.start()
        client = TCPStore(HOST, srv.port, token="t", timeout=10)
        client.set("x", b"1")
        assert client._sock.version() == "TLSv1.3"        # type: ignore[union-attr]
        client.close()
    mismatched = TlsFiles(job.cert, certs["stranger"].key, job.ca)   # key of another cert
    with pytest.raises(TlsConfigError, match="PYCOLL_TLS_KEY"):
        mismatched.client_context()
