"""Fixtures for the rendezvous tests: an in-process server (real sockets on 127.0.0.1)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from rdzv_util import HOST, raise_nofile  # noqa: E402

import rendezvous  # noqa: E402


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    raise_nofile(8192)
    monkeypatch.delenv("PYCOLL_TOKEN", raising=False)
    for name in ("PYCOLL_TLS_CERT", "PYCOLL_TLS_KEY", "PYCOLL_TLS_CA"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[rendezvous.StoreServer]:
    srv = rendezvous.StoreServer(HOST, 0, handshake_timeout=2.0).start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def store(server: rendezvous.StoreServer) -> Iterator[rendezvous.TCPStore]:
    with rendezvous.TCPStore(HOST, server.port, timeout=30) as s:
        yield s
