"""The ``Store`` protocol, and one set of semantics for the TCP store and ``LocalStore``.

Both stores run ``kv.KeyValueState``; the tests below run the same calls on each, so the two
cannot drift apart again. ``_as_stores`` is checked by mypy (the structural check of each
signature); the ``isinstance`` test checks the same at run time (names only).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from rdzv_util import HOST

from pycoll.launch.torch_store import TorchStoreAdapter
from rendezvous import (
    LocalStore,
    PrefixStore,
    Store,
    StoreError,
    StoreServer,
    StoreTimeout,
    TCPStore,
)

pytestmark = pytest.mark.timeout(60)


def _as_stores(tcp: TCPStore, local: LocalStore, prefix: PrefixStore,
               adapter: TorchStoreAdapter) -> list[Store]:
    return [tcp, local, prefix, adapter]          # mypy: each one satisfies the protocol


def test_every_store_satisfies_the_protocol(store: TCPStore) -> None:
    local = LocalStore()
    for candidate in _as_stores(store, local, PrefixStore("p", local),
                                TorchStoreAdapter(object(), 1.0)):
        assert isinstance(candidate, Store), candidate
    assert not isinstance(object(), Store)


@pytest.fixture(params=["tcp", "local"])
def stores(request: pytest.FixtureRequest,
           server: StoreServer) -> Iterator[tuple[Store, Store]]:
    """Two clients of one store: a thread blocked in the first one (a TCPStore client
    serializes its calls) is released through the second."""
    if request.param == "local":
        local = LocalStore(timeout=30)
        yield local, local
        return
    with TCPStore(HOST, server.port, timeout=30) as s, \
            TCPStore(HOST, server.port, timeout=30) as other:
        yield s, other


def test_compare_set(stores: tuple[Store, Store]) -> None:
    s, _ = stores
    assert s.compare_set("k", "x", "y") == b"x"           # missing, expected non-empty
    assert not s.check(["k"])
    assert s.compare_set("k", "", "first") == b"first"    # missing, expected empty: created
    assert s.compare_set("k", "other", "z") == b"first"   # mismatch: the current value
    assert s.compare_set("k", "first", "second") == b"second"
    assert s.get("k") == b"second"


def test_add_on_a_value_that_is_not_a_number(stores: tuple[Store, Store]) -> None:
    s, _ = stores
    s.set("word", "abc")
    with pytest.raises((StoreError, ValueError), match="is not an integer"):
        s.add("word", 1)
    assert s.add("n", 2) == 2 and s.add("n", -5) == -3


def test_a_wait_is_released_by_a_set_from_another_thread(stores: tuple[Store, Store]) -> None:
    s, feeder = stores
    s.set("a", "1")
    got: list[list[bytes]] = []
    t = threading.Thread(target=lambda: got.append(s.multi_get(["a", "b", "c"], timeout=20)))
    t.start()
    time.sleep(0.2)
    feeder.set("c", "3")
    feeder.set("b", "2")
    t.join(20)
    assert got == [[b"1", b"2", b"3"]]


def test_a_timeout_names_the_missing_keys(stores: tuple[Store, Store]) -> None:
    s, _ = stores
    s.set("here", "1")
    start = time.monotonic()
    with pytest.raises(StoreTimeout, match="gone"):
        s.multi_get(["here", "gone"], timeout=0.3)
    assert time.monotonic() - start < 10
    with pytest.raises(StoreTimeout):
        s.get("gone", timeout=0)                         # 0: check once


def test_a_key_deleted_after_a_wait_passed_it_is_waited_for_again(
        stores: tuple[Store, Store]) -> None:
    s, other = stores
    s.set("x", "1")
    done = threading.Event()

    def wait() -> None:
        s.multi_get(["x", "y"], timeout=20)
        done.set()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.2)                     # parked on "y", having passed "x"
    assert other.delete("x")
    other.set("y", "2")
    assert not done.wait(0.3)           # "x" is missing again
    other.set("x", "3")
    t.join(20)
    assert done.is_set()
