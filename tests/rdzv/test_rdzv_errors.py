"""Deadlines, connection failures and lost connections raise the right, informative errors."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from rdzv_util import HOST, cli_server, finish, free_port, reaped, run_child, spawn, wait_until

from rendezvous import (
    StoreConnectError,
    StoreConnectionLost,
    StoreError,
    StoreServer,
    StoreTimeout,
    TCPStore,
)

pytestmark = pytest.mark.timeout(60)


def test_get_timeout_names_key_and_deadline(store: TCPStore) -> None:
    with pytest.raises(StoreTimeout) as ei:
        store.get("never/rank3", timeout=0.2)
    msg = str(ei.value)
    assert "never/rank3" in msg and "0.2s" in msg and f"{HOST}:{store.port}" in msg
    assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, StoreError)
    store.set("x", "still works")
    assert store.get("x") == b"still works"


def test_wait_and_multi_get_timeout_name_missing_keys(store: TCPStore) -> None:
    store.set("have", "1")
    with pytest.raises(StoreTimeout) as ei:
        store.wait(["have", "miss/a", "miss/b"], timeout=0.2)
    msg = str(ei.value)
    assert "miss/a" in msg and "miss/b" in msg and "'have'" not in msg and "2 of 3" in msg
    with pytest.raises(StoreTimeout, match="miss/z"):
        store.multi_get(["have", "miss/z"], timeout=0.1)
    # timeout=0: check once, fail at once.
    with pytest.raises(StoreTimeout):
        store.get("miss/now", timeout=0)
    assert store.multi_get(["have"], timeout=0) == [b"1"]


def test_default_timeout_from_constructor(server: StoreServer) -> None:
    with TCPStore(HOST, server.port, timeout=0.3) as s:
        assert s.timeout == pytest.approx(0.3)
        with pytest.raises(StoreTimeout, match="0.3s"):
            s.get("nobody")
        with pytest.raises(StoreTimeout):
            s.wait(["nobody"])


def test_timeouts_across_processes(server: StoreServer) -> None:
    out = run_child(
        """
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
        try:
            s.multi_get([f"peer/{i}" for i in range(20)], timeout=0.3)
        except StoreTimeout as e:
            print(type(e).__name__, e)
        """,
        server.port,
    )
    assert out.startswith("StoreTimeout") and "peer/0" in out and "12 more" in out


def test_connect_error_is_informative() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(StoreConnectError) as ei:
        TCPStore(HOST, port, timeout=0.5)
    msg = str(ei.value)
    assert f"{HOST}:{port}" in msg and "retrying for" in msg and "Hint" in msg
    assert "attempts" in msg  # retried with backoff, not a single try


def test_client_started_before_server() -> None:
    port = free_port()
    client = spawn(
        """
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
        s.set("early", "bird")
        print(s.get("reply").decode())
        """,
        port,
    )
    with reaped(client):
        # Let the client hit "connection refused" a few times before the server exists.
        assert client.poll() is None
        time.sleep(0.3)
        srv = StoreServer(HOST, port).start()
        try:
            with TCPStore(HOST, port, timeout=30) as s:
                assert s.get("early") == b"bird"
                s.set("reply", "hello")
            rc, out, err = finish(client, 30)
            assert rc == 0, err
            assert out.strip() == "hello"
        finally:
            srv.close()


def test_connection_lost_when_server_killed() -> None:
    with cli_server() as (proc, port):
        s = TCPStore(HOST, port, timeout=60)
        s.set("k", "v")
        box: dict = {}

        def blocked() -> None:
            try:
                s.get("never", timeout=60)
            except BaseException as e:  # noqa: BLE001 - recorded for the assertion
                box["err"] = e

        t = threading.Thread(target=blocked, daemon=True)
        t.start()
        time.sleep(0.3)  # give the get time to be sent and parked
        proc.send_signal(signal.SIGKILL)
        t.join(20)
        assert not t.is_alive(), "client hung after the server died"
        assert isinstance(box.get("err"), StoreConnectionLost), box
        assert f"{HOST}:{port}" in str(box["err"])
        s.close()


def test_connection_lost_when_server_closes_mid_call() -> None:
    srv = StoreServer(HOST, 0).start()
    s = TCPStore(HOST, srv.port, timeout=30)
    box: dict = {}

    def blocked() -> None:
        try:
            s.multi_get(["a", "b"], timeout=30)
        except BaseException as e:  # noqa: BLE001
            box["err"] = e

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    try:
        assert wait_until(lambda: b"a" in dict(srv._kv.watchers), 10)
        srv.close()
        t.join(20)
        assert not t.is_alive()
        assert isinstance(box.get("err"), StoreConnectionLost), box
        # The next call tries to reconnect and reports that the server is gone.
        s.timeout = 0.3
        with pytest.raises(StoreConnectError):
            s.get("a")
    finally:
        s.close()
        srv.close()


def test_reconnects_after_server_restart_on_same_port() -> None:
    srv = StoreServer(HOST, 0).start()
    port = srv.port
    s = TCPStore(HOST, port, timeout=10)
    s.set("a", "1")
    srv.close()
    with pytest.raises(StoreConnectionLost):
        s.get("a")
    srv2 = StoreServer(HOST, port).start()
    try:
        s.set("a", "2")  # reconnects transparently on the next call
        assert s.get("a") == b"2"
    finally:
        s.close()
        srv2.close()
