"""Scale: 1000+ concurrent clients bootstrapping, and 2000 clients connected at once."""

from __future__ import annotations

import pytest
from rdzv_util import HOST, cli_server, finish, read_line, reaped, spawn, wait_until

from rendezvous import StoreServer, TCPStore

pytestmark = pytest.mark.timeout(110)

BOOTSTRAP = """
    port, world, first, count = map(int, sys.argv[1:5])
    keys = [f"addr/{r}" for r in range(world)]
    go = threading.Event()
    errors, ok = [], []
    lock = threading.Lock()
    def rank(r):
        go.wait(60)
        try:
            s = TCPStore("127.0.0.1", port, timeout=90)
            s.set(keys[r], f"tcp://127.0.0.1:{20000 + r}|rank={r}")
            vals = s.multi_get(keys)
            assert len(vals) == world
            assert all(v == f"tcp://127.0.0.1:{20000 + i}|rank={i}".encode()
                       for i, v in enumerate(vals))
            with lock:
                ok.append(s)  # stay connected until everyone in this process is done
        except BaseException as e:
            with lock:
                errors.append(f"rank {r}: {e!r}")
    ts = [threading.Thread(target=rank, args=(r,), daemon=True)
          for r in range(first, first + count)]
    [t.start() for t in ts]
    go.set()
    [t.join(100) for t in ts]
    print(len(ok), len(errors), errors[:3], flush=True)
    for s in ok:
        s.close()
"""


def test_bootstrap_1040_clients() -> None:
    """1040 real clients over TCP (2 processes x 520 threads) each publish and fetch all."""
    world, procs = 1040, 2
    per = world // procs
    with cli_server() as (server, port):
        children = [spawn(BOOTSTRAP, port, world, i * per, per) for i in range(procs)]
        with reaped(*children):
            for c in children:
                rc, out, err = finish(c, 100)
                assert rc == 0, err[-3000:]
                n_ok, n_err = map(int, out.split()[:2])
                assert (n_ok, n_err) == (per, 0), out
        with TCPStore(HOST, port, timeout=10) as s:
            assert s.num_keys() == world
        assert server.poll() is None  # still serving


HOLD = """
    port, n, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    clients = [TCPStore("127.0.0.1", port, timeout=60) for _ in range(n)]
    print("connected", flush=True)
    assert sys.stdin.readline().strip() == "go"
    for i, c in enumerate(clients):
        c.add("held", 1)
    for i, c in enumerate(clients):
        c.set(f"{tag}/{i}", str(i))
    # Every client still works: each reads back its neighbour's key.
    for i, c in enumerate(clients):
        assert c.get(f"{tag}/{(i + 1) % n}") == str((i + 1) % n).encode()
    print(clients[0].add("held", 0), flush=True)
    for c in clients:
        c.close()
"""


def test_2000_concurrent_connections() -> None:
    """The server holds 2000 connected clients at once and serves every one of them."""
    srv = StoreServer(HOST, 0).start()
    try:
        children = [spawn(HOLD, srv.port, 1000, f"p{i}", stdin=True) for i in range(2)]
        with reaped(*children):
            for c in children:
                assert read_line(c.stdout, 90).strip() == "connected"
            assert wait_until(lambda: srv.num_connections >= 2000, 30), srv.num_connections
            for c in children:
                c.stdin.write("go\n")
                c.stdin.flush()
            totals = []
            for c in children:
                rc, out, err = finish(c, 90)
                assert rc == 0, err[-3000:]
                totals.append(int(out.split()[-1]))
            assert max(totals) == 2000
        assert wait_until(lambda: srv.num_connections == 0, 30)
    finally:
        srv.close()
