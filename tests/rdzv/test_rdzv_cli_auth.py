"""The standalone server CLI and token authentication."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading

import pytest
from rdzv_util import HOST, child_env, cli_server, finish, run_child, spawn

from rendezvous import AuthError, StoreServer, TCPStore

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-job-token-7f1c"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_and_exits_cleanly(sig: signal.Signals) -> None:
    with cli_server() as (proc, port):
        out = run_child(
            """
            s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
            s.set("k", "v"); print(s.get("k").decode(), s.add("n", 2))
            """,
            port,
        )
        assert out.split() == ["v", "2"]
        held = TCPStore(HOST, port, timeout=10)  # an open client must not block shutdown
        proc.send_signal(sig)
        try:
            rc = proc.wait(20)
        finally:
            held.close()
        assert rc == 0


def test_cli_ipv6_and_explicit_port() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    with cli_server(host="::1") as (proc, port):
        with TCPStore("::1", port, timeout=10) as s:
            s.set("a", "b")
            assert s.get("a") == b"b"


def test_cli_bad_arguments_exit_nonzero() -> None:
    r = subprocess.run([sys.executable, "-m", "rendezvous", "serve", "--port", "notaport"],
                       capture_output=True, text=True, timeout=30, env=child_env())
    assert r.returncode != 0


def test_cli_token_file(tmp_path) -> None:
    tf = tmp_path / "token"
    tf.write_text(TOKEN + "\n")
    with cli_server("--token-file", str(tf)) as (proc, port):
        ok = run_child(
            """
            s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)  # token from PYCOLL_TOKEN
            s.set("k", "v"); print(s.get("k").decode())
            """,
            port,
            env=child_env(PYCOLL_TOKEN=TOKEN),
        )
        assert ok.strip() == "v"
        bad = run_child(
            """
            try:
                TCPStore("127.0.0.1", int(sys.argv[1]), token="wrong", timeout=30)
            except AuthError as e:
                print("AuthError", e)
            try:
                TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
            except AuthError as e:
                print("AuthError", e)
            """,
            port,
        )
        assert bad.count("AuthError") == 2 and "does not match" in bad and "no token" in bad
        proc.send_signal(signal.SIGTERM)
        rc, _, err = finish(proc, 20)
    assert rc == 0
    assert "authentication failed" in err and "wrong token" in err and "missing token" in err
    assert TOKEN not in err  # never logged


def test_auth_success_and_failures(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rendezvous.server")
    with TCPStore(HOST, 0, is_server=True, token=TOKEN, timeout=10) as s:
        assert s.server is not None and s.server.auth_required
        s.set("k", "v")
        with TCPStore(HOST, s.port, token=TOKEN, timeout=10) as good:
            assert good.get("k") == b"v"
        with pytest.raises(AuthError, match="does not match"):
            TCPStore(HOST, s.port, token="nope", timeout=10)
        with pytest.raises(AuthError, match="no token"):
            TCPStore(HOST, s.port, timeout=10)
        # AuthError is final: no retrying until the deadline (the timeout above is 10 s and
        # the server logged exactly one failure per attempt).
        fails = [r for r in caplog.records if "authentication failed" in r.getMessage()]
        assert len(fails) == 2
        assert s.get("k") == b"v"  # the legitimate client is unaffected


def test_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCOLL_TOKEN", TOKEN)
    with TCPStore(HOST, 0, is_server=True, timeout=10) as s:
        assert s.server is not None and s.server.auth_required
        with TCPStore(HOST, s.port, timeout=10) as c:  # env token
            c.set("a", "1")
        with pytest.raises(AuthError):
            TCPStore(HOST, s.port, token="other", timeout=10)  # argument beats env
        out = run_child(
            """
            s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
            print(s.get("a").decode())
            """,
            s.port,
            env=child_env(PYCOLL_TOKEN=TOKEN),
        )
        assert out.strip() == "1"


def test_client_with_token_refuses_unauthenticated_server(server: StoreServer) -> None:
    with pytest.raises(AuthError, match="does not require a token"):
        TCPStore(HOST, server.port, token=TOKEN, timeout=10)
    with TCPStore(HOST, server.port, token="", timeout=10) as c:  # explicit opt-out
        c.set("x", "1")


def test_token_never_sent_in_clear() -> None:
    """Relay a real authenticated session through a recording proxy; the token never appears."""
    srv = StoreServer(HOST, 0, token=TOKEN).start()
    lsock = socket.create_server((HOST, 0))
    lsock.settimeout(20)
    recorded = bytearray()
    done = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                recorded.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def proxy() -> None:
        try:
            a, _ = lsock.accept()
        except OSError:
            done.set()
            return
        b = socket.create_connection((HOST, srv.port), timeout=20)
        t1 = threading.Thread(target=pump, args=(a, b), daemon=True)
        t2 = threading.Thread(target=pump, args=(b, a), daemon=True)
        t1.start(), t2.start()
        t1.join(20), t2.join(20)
        a.close(), b.close()
        done.set()

    pt = threading.Thread(target=proxy, daemon=True)
    pt.start()
    try:
        with TCPStore(HOST, lsock.getsockname()[1], token=TOKEN, timeout=10) as c:
            c.set("through", "proxy")
            assert c.get("through") == b"proxy"
        assert done.wait(20)
        assert len(recorded) > 100
        assert TOKEN.encode() not in recorded
    finally:
        lsock.close()
        pt.join(20)
        srv.close()


def test_auth_across_processes_many_clients() -> None:
    """Several processes authenticate concurrently while wrong-token clients are rejected."""
    srv = StoreServer(HOST, 0, token=TOKEN).start()
    try:
        good = """
            port = int(sys.argv[1])
            errs = []
            def w(i):
                try:
                    s = TCPStore("127.0.0.1", port, timeout=30)
                    s.add("authed", 1)
                except BaseException as e:
                    errs.append(repr(e))
            ts = [threading.Thread(target=w, args=(i,)) for i in range(20)]
            [t.start() for t in ts]; [t.join(30) for t in ts]
            assert not errs, errs
        """
        bad = """
            n = 0
            for i in range(10):
                try:
                    TCPStore("127.0.0.1", int(sys.argv[1]), token=f"bad{i}", timeout=30)
                except AuthError:
                    n += 1
            print(n)
        """
        procs = [spawn(good, srv.port, env=child_env(PYCOLL_TOKEN=TOKEN)) for _ in range(3)]
        procs.append(spawn(bad, srv.port))
        results = [finish(p, 60) for p in procs]
        for rc, _out, err in results:
            assert rc == 0, err
        assert results[-1][1].strip() == "10"
        with TCPStore(HOST, srv.port, token=TOKEN, timeout=10) as s:
            assert s.add("authed", 0) == 60
    finally:
        srv.close()
