"""The store API, within one process and across processes (real sockets, real processes)."""

from __future__ import annotations

import datetime
import json
import socket
import threading

import pytest
from rdzv_util import HOST, finish, reaped, run_child, spawn, wait_until

import rendezvous
from rendezvous import PrefixStore, StoreServer, StoreTimeout, TCPStore

pytestmark = pytest.mark.timeout(60)


def test_public_names() -> None:
    for name in ("TCPStore", "PrefixStore", "StoreServer", "StoreError", "StoreTimeout",
                 "StoreConnectError", "StoreConnectionLost", "AuthError"):
        assert hasattr(rendezvous, name), name
    for name in ("StoreTimeout", "StoreConnectError", "StoreConnectionLost", "AuthError"):
        assert issubclass(getattr(rendezvous, name), rendezvous.StoreError)
    assert issubclass(rendezvous.StoreError, RuntimeError)


def test_semantics_single_client(store: TCPStore) -> None:
    store.set("a", b"\x00\xffbin")
    assert store.get("a") == b"\x00\xffbin"
    store.set("s", "héllo")  # str values are UTF-8 encoded
    assert store.get("s") == "héllo".encode()
    assert isinstance(store.get("s"), bytes)
    store.set("empty", b"")
    assert store.get("empty") == b""

    assert store.add("n", 5) == 5  # created at 0
    assert store.add("n", -2) == 3
    assert store.add("n", 0) == 3
    assert store.get("n") == b"3"

    assert store.check(["a", "n"]) is True
    assert store.check(["a", "missing"]) is False
    assert store.check("a") is True
    assert store.delete("a") is True
    assert store.delete("a") is False
    assert store.check(["a"]) is False

    before = store.num_keys()
    store.multi_set(["m1", "m2", "m3"], [b"1", "2", b"3"])
    assert store.num_keys() == before + 3
    assert store.multi_get(["m3", "m1", "m2"]) == [b"3", b"1", b"2"]
    assert store.multi_get([]) == []

    store.append("log", b"a")
    store.append("log", "b")
    assert store.get("log") == b"ab"
    store.wait(["m1", "log"])  # all present: returns at once
    store.wait("m1", timeout=datetime.timedelta(seconds=1))

    with pytest.raises(TypeError):
        store.set(b"bytes-key", b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.set("k", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        store.multi_set(["a", "b"], [b"1"])
    with pytest.raises(rendezvous.StoreError, match="not an integer"):
        store.add("s", 1)
    assert store.get("s") == "héllo".encode()  # the failed add left the value and the link alone
    store.ping()


def test_compare_set_c10d_semantics(store: TCPStore) -> None:
    # Missing key + non-empty expected: nothing stored, ``expected`` returned.
    assert store.compare_set("cs", b"x", b"y") == b"x"
    assert not store.check(["cs"])
    # Missing key + empty expected: created.
    assert store.compare_set("cs", b"", b"first") == b"first"
    # Mismatch: current value returned, unchanged.
    assert store.compare_set("cs", b"other", b"z") == b"first"
    assert store.get("cs") == b"first"
    # Match: swapped.
    assert store.compare_set("cs", "first", "second") == b"second"
    assert store.get("cs") == b"second"


def test_embedded_server_and_context_manager() -> None:
    with TCPStore(HOST, 0, is_server=True, timeout=10) as s:
        assert s.port > 0 and s.host == HOST
        assert s.server is not None and s.server.port == s.port
        s.set("k", "v")
        with TCPStore(HOST, s.port, timeout=10) as c:
            assert c.get("k") == b"v"
        port = s.port
    with pytest.raises(rendezvous.StoreError):
        s.get("k")  # closed client
    # The embedded server stopped with its owner.
    with socket.socket() as probe:
        assert probe.connect_ex((HOST, port)) != 0


def test_standalone_server_object() -> None:
    srv = StoreServer(HOST, 0)
    try:
        assert srv.port > 0
        srv.start()
        with TCPStore(HOST, srv.port, timeout=10) as c:
            c.set("x", "1")
            assert c.get("x") == b"1"
    finally:
        srv.close()


def test_api_across_processes(server: StoreServer) -> None:
    writer = """
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
        s.set("w/plain", b"\\x01\\x02")
        s.multi_set(["w/m0", "w/m1"], ["zero", b"one"])
        print(s.add("w/ctr", 41))
        s.append("w/app", "abc")
        print(s.compare_set("w/cs", "", "init").decode())
        s.close()
    """
    out = run_child(writer, server.port)
    assert out.split() == ["41", "init"]
    reader = """
        import json
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
        r = {
            "plain": s.get("w/plain").hex(),
            "multi": [v.decode() for v in s.multi_get(["w/m1", "w/m0"])],
            "ctr": s.add("w/ctr", 1),
            "app": s.get("w/app").decode(),
            "cs": s.compare_set("w/cs", "init", "next").decode(),
            "check": [s.check(["w/plain", "w/m0"]), s.check(["w/nope"])],
            "deleted": [s.delete("w/plain"), s.delete("w/plain")],
            "n": s.num_keys(),
        }
        print(json.dumps(r))
    """
    r = json.loads(run_child(reader, server.port))
    assert r == {
        "plain": "0102", "multi": ["one", "zero"], "ctr": 42, "app": "abc", "cs": "next",
        "check": [True, False], "deleted": [True, False], "n": 5,
    }
    with TCPStore(HOST, server.port, timeout=10) as s:
        assert s.get("w/cs") == b"next"
        assert not s.check(["w/plain"])


def _parked_on(server: StoreServer, key: str) -> bool:
    # Test-side observation of server state: a waiter is parked on ``key``.
    return key.encode() in dict(server._kv.watchers)


def test_blocking_calls_released_by_another_process(server: StoreServer) -> None:
    waiter = """
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=60)
        print("get", s.get("late/a").decode(), flush=True)
        s.wait(["late/b", "late/c"])
        print("wait ok", flush=True)
        print("multi", [v.decode() for v in s.multi_get(["late/d", "late/e"], timeout=60)],
              flush=True)
    """
    setter = """
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
        what = sys.argv[2]
        if what == "a": s.set("late/a", "A")
        elif what == "bc": s.set("late/b", "B"); s.set("late/c", "C")
        else: s.multi_set(["late/e", "late/d"], ["E", "D"])
    """
    w = spawn(waiter, server.port)
    with reaped(w):
        assert wait_until(lambda: _parked_on(server, "late/a"), 30), "child never blocked on get"
        run_child(setter, server.port, "a")
        assert wait_until(lambda: _parked_on(server, "late/b"), 30), "child never blocked on wait"
        run_child(setter, server.port, "bc")
        assert wait_until(lambda: _parked_on(server, "late/d"), 30), \
            "child never blocked on multi_get"
        run_child(setter, server.port, "de")
        rc, out, err = finish(w, 30)
    assert rc == 0, err
    assert out.splitlines() == ["get A", "wait ok", "multi ['D', 'E']"]


def test_waiter_survives_delete_of_a_seen_key(store: TCPStore, server: StoreServer) -> None:
    result: dict = {}

    def waiter() -> None:
        with TCPStore(HOST, server.port, timeout=30) as c:
            result["v"] = c.multi_get(["d/1", "d/2"], timeout=30)

    t = threading.Thread(target=waiter)
    t.start()
    try:
        assert wait_until(lambda: _parked_on(server, "d/1"), 10)
        store.set("d/1", "one")
        assert wait_until(lambda: _parked_on(server, "d/2"), 10)
        store.delete("d/1")  # seen by the waiter, then deleted again
        store.set("d/2", "two")
        assert wait_until(lambda: _parked_on(server, "d/1"), 10), "waiter must wait for d/1 again"
        assert "v" not in result
        store.set("d/1", "uno")
    finally:
        t.join(30)
    assert result["v"] == [b"uno", b"two"]


def test_concurrent_add_from_many_processes(server: StoreServer) -> None:
    # 4 processes x 8 threads; half the threads share one client (thread-safety), half own one.
    code = """
        port, reps = int(sys.argv[1]), int(sys.argv[2])
        shared = TCPStore("127.0.0.1", port, timeout=60)
        errors = []
        def work(i):
            try:
                s = shared if i % 2 else TCPStore("127.0.0.1", port, timeout=60)
                for j in range(reps):
                    s.add("ctr", 1)
                    s.add("ctr_big", 1000 + i)
                    s.set(f"p{os.getpid()}/{i}", str(j))
                    assert s.get(f"p{os.getpid()}/{i}") == str(j).encode()
            except BaseException as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        [t.start() for t in ts]
        [t.join(60) for t in ts]
        assert not errors, errors
        print("ok")
    """
    reps = 25
    procs = [spawn(code, server.port, reps) for _ in range(4)]
    with reaped(*procs):
        for p in procs:
            rc, out, err = finish(p, 60)
            assert rc == 0 and out.strip() == "ok", err
    with TCPStore(HOST, server.port, timeout=10) as s:
        assert s.add("ctr", 0) == 4 * 8 * reps
        assert s.add("ctr_big", 0) == 4 * reps * sum(1000 + i for i in range(8))


def test_prefix_store_isolation(server: StoreServer) -> None:
    code = """
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
        p = PrefixStore(sys.argv[2], s)
        p.set("rank", sys.argv[2])
        p.multi_set(["x", "y"], [sys.argv[2] + "x", sys.argv[2] + "y"])
        print(p.add("count", 1))
    """
    run_child(code, server.port, "jobA")
    run_child(code, server.port, "jobB")
    with TCPStore(HOST, server.port, timeout=10) as s:
        a, b = PrefixStore("jobA", s), PrefixStore("jobB", s)
        assert a.get("rank") == b"jobA" and b.get("rank") == b"jobB"
        assert a.multi_get(["x", "y"]) == [b"jobAx", b"jobAy"]
        assert b.add("count", 0) == 1 and a.add("count", 0) == 1
        assert s.get("jobA/rank") == b"jobA"  # c10d layout: prefix + "/" + key
        assert a.delete("rank") and b.check(["rank"]) and not a.check(["rank"])
        with pytest.raises(StoreTimeout):
            a.get("rank", timeout=0.2)
        a.wait(["x"], timeout=5)
        assert a.compare_set("x", "jobAx", "new") == b"new" and b.get("x") == b"jobBx"
        a.append("x", "!")
        assert a.get("x") == b"new!"
        nested = PrefixStore("g1", a)
        nested.set("k", "v")
        assert s.get("jobA/g1/k") == b"v"
        # num_keys counts the whole underlying store (documented, like c10d).
        assert a.num_keys() == s.num_keys() == b.num_keys()
        with pytest.raises(TypeError):
            PrefixStore("p", s).set(1, "v")  # type: ignore[arg-type]


def test_ipv6_loopback() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    with TCPStore("::1", 0, is_server=True, timeout=10) as s:
        assert s.address == f"[::1]:{s.port}"
        out = run_child(
            """
            c = TCPStore("::1", int(sys.argv[1]), timeout=30)
            c.set("v6", "yes"); print(c.get("v6").decode())
            """,
            s.port,
        )
        assert out.strip() == "yes"
        assert s.get("v6") == b"yes"


def test_size_limits() -> None:
    srv = StoreServer(HOST, 0, max_key_size=16, max_value_size=64).start()
    try:
        with TCPStore(HOST, srv.port, timeout=10) as s:
            s.set("k" * 16, b"v" * 64)
            with pytest.raises(rendezvous.StoreLimitError, match="max_key_size"):
                s.set("k" * 17, b"v")
            with pytest.raises(rendezvous.StoreLimitError, match="max_value_size"):
                s.set("k", b"v" * 65)
            s.append("ap", b"v" * 60)
            with pytest.raises(rendezvous.StoreError, match="max_value_size"):
                s.append("ap", b"v" * 10)  # the *result* would exceed the limit
            # Bypass the client-side check: the server rejects it and keeps the connection.
            s._max_value = 1 << 20
            with pytest.raises(rendezvous.StoreError, match="max_value_size"):
                s.set("k", b"v" * 1000)
            assert s.get("k" * 16) == b"v" * 64
    finally:
        srv.close()


def test_large_value_roundtrip(store: TCPStore) -> None:
    blob = bytes(range(256)) * (4 * 4096)  # 4 MiB
    store.set("big", blob)
    out = run_child(
        """
        import hashlib
        s = TCPStore("127.0.0.1", int(sys.argv[1]), timeout=30)
        print(hashlib.sha256(s.get("big")).hexdigest())
        """,
        store.port,
    )
    import hashlib

    assert out.strip() == hashlib.sha256(blob).hexdigest()


def test_infinite_timeout_and_timedelta(server: StoreServer) -> None:
    with TCPStore(HOST, server.port, timeout=datetime.timedelta(seconds=20)) as s:
        assert s.timeout == 20.0
        box: dict = {}

        def waiter() -> None:
            with TCPStore(HOST, server.port, timeout=20) as c:
                box["v"] = c.get("inf/k", timeout=float("inf"))

        t = threading.Thread(target=waiter)
        t.start()
        assert wait_until(lambda: _parked_on(server, "inf/k"), 10)
        s.set("inf/k", "done")
        t.join(20)
        assert box["v"] == b"done"


def test_protocol_decoder_rejects_garbage_without_overreading() -> None:
    import random

    from rendezvous import protocol as P

    rng = random.Random(5)
    for _ in range(3000):
        payload = rng.randbytes(rng.randint(0, 64))
        try:
            code, arg, blobs = P.decode_message(payload)
        except P.MalformedFrame:
            continue
        assert sum(map(len, blobs)) <= len(payload)
    msg = P.encode_message(P.Op.MULTI_SET, 7, [b"a", b"", b"ccc", b"d"])
    assert P.decode_message(msg[4:]) == (P.Op.MULTI_SET, 7, [b"a", b"", b"ccc", b"d"])
    assert P.decode_message(bytearray(msg[4:]))[2] == [b"a", b"", b"ccc", b"d"]
