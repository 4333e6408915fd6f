"""The transport registry: per-pair choices every rank agrees on, allow-lists, clear refusals."""
from __future__ import annotations

import pytest

from pycoll.testing import run_ranks, run_threads, same_host_transport
from pycoll.transports import registry


def _choices(comm):
    return [comm.transport_of(p) if p != comm.rank else None for p in range(comm.size)]


def _symmetric(views):
    for a, row in enumerate(views):
        for b, name in enumerate(row):
            if a != b:
                assert name == views[b][a], (a, b, name, views[b][a])


def test_choice_is_symmetric_and_follows_the_layout():
    # Two virtual nodes of two ranks: shm inside a node, tcp between nodes.
    # Where CuPy and a CUDA driver are (a GPU machine), cuda_ipc serves a host's pairs.
    views = run_ranks(_choices, 4, env={"PYCOLL_VIRTUAL_NODE_SIZE": "2"})
    _symmetric(views)
    local = same_host_transport()
    for a, row in enumerate(views):
        for b, name in enumerate(row):
            if a != b:
                assert name == (local if a // 2 == b // 2 else "tcp"), (a, b, name)


def test_allow_list_order_is_the_preference():
    views = run_ranks(_choices, 3, env={"PYCOLL_TRANSPORTS": "tcp,shm"})
    assert all(name in (None, "tcp") for row in views for name in row), views
    views = run_ranks(_choices, 3, env={"PYCOLL_TRANSPORTS": "shm,tcp"})
    assert all(name in (None, "shm") for row in views for name in row), views


def _noop(comm):
    return comm.size


def test_forcing_a_transport_that_cannot_serve_a_pair_fails_on_every_rank():
    outcomes = run_ranks(_noop, 4, env={"PYCOLL_TRANSPORTS": "shm",
                                        "PYCOLL_VIRTUAL_NODE_SIZE": "2"},
                         expect_failure=True)
    for kind, text in outcomes:
        assert kind == "TransportError", (kind, text)
        assert "shm cannot connect ranks on different hosts" in text, text
        assert "PYCOLL_TRANSPORTS" in text


@pytest.mark.parametrize("env,words", [
    ({"PYCOLL_TRANSPORTS": "ucx"}, ["PYCOLL_TRANSPORTS", "unknown transport", "tcp", "verbs"]),
    ({"PYCOLL_TRANSPORTS": "tcp,carrier-pigeon"}, ["PYCOLL_TRANSPORTS", "carrier-pigeon"]),
])
def test_unknown_transport_names_are_refused_clearly(env, words):
    for kind, text in run_ranks(_noop, 2, env=env, expect_failure=True):
        assert kind == "InvalidArgument", (kind, text)
        for w in words:
            assert w in text, (w, text)


def test_inproc_is_never_chosen_unless_named():
    assert "inproc" not in registry.allowed_transports()
    assert run_threads(_choices, 3) == [[None, "inproc", "inproc"], ["inproc", None, "inproc"],
                                        ["inproc", "inproc", None]]


def test_a_transport_is_one_module_and_one_registry_line():
    for name, (module, cls) in registry.REGISTRY.items():
        t = registry.transport_class(name)
        assert t.name == name and t.capabilities.name == name
        assert t.__module__ == module and t.__name__ == cls
        for method in ("probe", "can_connect", "address", "connect", "progress", "close"):
            assert callable(getattr(t, method)), (name, method)


def test_forcing_verbs_where_no_rdma_device_is_usable_says_why():
    """Forcing verbs on a machine whose probe fails (here: the host without RDMA, or a VM
    with every device excluded) fails on every rank, naming what is missing."""
    env = {"PYCOLL_TRANSPORTS": "verbs", "PYCOLL_IB_HCA": "=no_such_hca"}
    for kind, text in run_ranks(_noop, 2, env=env, expect_failure=True):
        assert kind == "InvalidArgument", (kind, text)
        assert "verbs" in text and ("pyverbs" in text or "RDMA" in text), text
