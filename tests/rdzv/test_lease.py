"""Leases (``TCPStore.lease``): a key that says whether its holder's connection is open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from rdzv_util import HOST, wait_until

from rendezvous import PrefixStore, StoreError, StoreServer, TCPStore

pytestmark = pytest.mark.timeout(60)


def test_lease_flips_when_the_holder_closes(server: StoreServer, store: TCPStore) -> None:
    holder = TCPStore(HOST, server.port, timeout=10)
    holder.lease("alive/3", "1", "0")
    assert store.get("alive/3") == b"1"
    holder.close()
    assert wait_until(lambda: store.get("alive/3") == b"0", 5.0)


def test_lease_through_a_prefix_store(server: StoreServer, store: TCPStore) -> None:
    holder = TCPStore(HOST, server.port, timeout=10)
    PrefixStore("job", holder).lease("alive/0", "1", "0", keepalive_ms=1000)
    assert store.get("job/alive/0") == b"1"
    holder.close()
    assert wait_until(lambda: store.get("job/alive/0") == b"0", 5.0)


def test_lease_flips_when_the_holder_is_killed(server: StoreServer, store: TCPStore) -> None:
    """SIGKILL: the kernel closes the dead process's socket; the server sees it at once."""
    code = ("import sys, time; from rendezvous import TCPStore; "
            f"s = TCPStore({HOST!r}, {server.port}, timeout=10); "
            "s.lease('alive/7', '1', '0'); print('held', flush=True); time.sleep(60)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"held"
        assert store.get("alive/7") == b"1"
        child.send_signal(signal.SIGKILL)
        start = time.monotonic()
        assert wait_until(lambda: store.get("alive/7") == b"0", 5.0)
        assert time.monotonic() - start < 5.0
    finally:
        child.kill()
        child.wait(10)


def test_a_waiter_wakes_on_the_flip(server: StoreServer, store: TCPStore) -> None:
    """The flip is a ``set``: a client blocked in ``get`` on a key that only the holder's
    leaving creates wakes up."""
    holder = TCPStore(HOST, server.port, timeout=10)
    holder.lease("gone/1", "", "bye")
    store.delete("gone/1")            # the key now exists only once the holder leaves
    holder.close()
    assert store.get("gone/1", timeout=5) == b"bye"


def test_leases_per_connection_are_bounded(server: StoreServer) -> None:
    holder = TCPStore(HOST, server.port, timeout=10)
    try:
        for k in range(64):
            holder.lease(f"l/{k}", "1", "0")
        holder.lease("l/0", "1", "0")          # renewing a held key is not a new lease
        with pytest.raises(StoreError, match="at most 64 leases"):
            holder.lease("l/64", "1", "0")
    finally:
        holder.close()


def test_a_newer_lease_on_the_key_wins(server: StoreServer, store: TCPStore) -> None:
    """init -> finalize -> init under the same key: the first holder's close, processed late,
    must not flip the second holder's key."""
    first = TCPStore(HOST, server.port, timeout=10)
    first.lease("alive/0", "1", "0")
    second = TCPStore(HOST, server.port, timeout=10)
    second.lease("alive/0", "1", "0")
    first.close()
    time.sleep(0.3)
    assert store.get("alive/0") == b"1"
    second.close()
    assert wait_until(lambda: store.get("alive/0") == b"0", 5.0)
