"""TLS on the tcp transport (``PYCOLL_TLS_CERT/KEY/CA``), with real certificates made by the
test (``openssl``) and real ranks over loopback: results, striping, a rank of another CA, a
plain stranger on a TLS data port, variables set only in part.

The store's side is tests/rdzv/test_store_tls.py, two namespace hosts (and the bytes on
their wire) tests/multihost/test_tls_hosts.py.
"""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pycoll.testing import run_ranks
from pycoll.testing.certs import make_job_certificates, openssl_available
from pycoll.transports.wireup import HELLO, MAGIC, proof

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not openssl_available(), reason="no openssl command")]

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tls-test-secret"
SIZES = (0, 1, 1000, 4097, 1 << 16, (1 << 19) + 3, 3 << 20)     # elements of float32


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The job's CA with two certificates, and a certificate of another CA ("stranger")."""
    root = tmp_path_factory.mktemp("tls")
    job = make_job_certificates(root / "job", ["rank0", "rank1", "store"])
    other = make_job_certificates(root / "other", ["stranger"], ca_name="another-ca")
    return {**job, **other}


@pytest.fixture
def tls_store(certs, monkeypatch):
    """run_ranks' store (this process) and every rank speak TLS."""
    monkeypatch.setenv("PYCOLL_TOKEN", TOKEN)
    for name, value in certs["store"].items():
        monkeypatch.setenv(name, value)
    return certs


def _rank_env(certs, **extra: str) -> dict[int, dict[str, str]]:
    return {r: {**certs[f"rank{r}"], **extra} for r in range(2)}


def _collectives(comm):
    peer = 1 - comm.rank
    ch = comm.channel(peer)
    ok = {}
    for n in SIZES:
        a = np.arange(n, dtype=np.float32) + comm.rank
        comm.allreduce(a)
        ok[f"allreduce {n}"] = bool(np.array_equal(a, 2 * np.arange(n, dtype=np.float32) + 1))
        b = (np.arange(n, dtype=np.float32) * 3 if comm.rank == 1
             else np.zeros(n, dtype=np.float32))
        comm.broadcast(b, 1)
        ok[f"broadcast {n}"] = bool(np.array_equal(b, np.arange(n, dtype=np.float32) * 3))
        got = np.empty(n, dtype=np.int32)
        works = [comm.send(np.full(n, 7 + comm.rank, np.int32), peer, tag=3, async_op=True),
                 comm.recv(got, peer, tag=3, async_op=True)]
        for w in works:
            w.wait()
        ok[f"sendrecv {n}"] = bool((got == 7 + peer).all())
    sockets = [lane.sock for lane in ch._lanes]
    return {"ok": ok, "channel": type(ch).__name__,
            "versions": [s.version() if isinstance(s, ssl.SSLSocket) else None for s in sockets]}


@pytest.mark.parametrize("nsocks", ["1", "2"])
def test_tls_results_over_tcp(tls_store, nsocks):
    env = _rank_env(tls_store, PYCOLL_TRANSPORTS="tcp", PYCOLL_SOCKET_NSOCKS=nsocks)
    results = run_ranks(_collectives, 2, rank_env=env, timeout=90)
    for rank, res in enumerate(results):
        assert all(res["ok"].values()), (rank, [k for k, v in res["ok"].items() if not v])
        assert res["channel"] == "TlsChannel", res
        assert res["versions"] == ["TLSv1.3"] * int(nsocks), res


def _plain_channel(comm):
    ch = comm.channel(1 - comm.rank)
    a = np.ones(1000, np.float32)
    comm.allreduce(a)
    return type(ch).__name__, type(ch._lanes[0].sock).__name__, float(a[0])


def test_without_the_variables_sockets_stay_plain(monkeypatch):
    for name in ("PYCOLL_TLS_CERT", "PYCOLL_TLS_KEY", "PYCOLL_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    results = run_ranks(_plain_channel, 2, env={"PYCOLL_TRANSPORTS": "tcp"})
    assert results == [("TcpChannel", "socket", 2.0)] * 2


def _allreduce_once(comm):
    a = np.ones(1 << 16, np.float32)
    comm.allreduce(a)
    return float(a[0])


def _fails_naming(outcomes, rank: int, kind: str, *words: str) -> str:
    got_kind, text = outcomes[rank]
    assert got_kind == kind, (rank, outcomes[rank])
    for word in words:
        assert word in text, (rank, word, text[-2000:])
    return text


@pytest.mark.parametrize("bad", [0, 1])
def test_a_data_port_of_another_ca_is_refused_on_every_rank(tls_store, monkeypatch, bad):
    """Rank ``bad`` holds a certificate of another CA. It trusts both CAs, and so does the
    store: both ranks get past the store, and the tcp handshake between them fails: rank 1
    dials, so it reports the refusal (its certificate refused by rank 0, or rank 0's not
    signed by its CA); rank 0 learns it from rank 1's abort. Nobody hangs."""
    both = Path(tls_store["stranger"]["PYCOLL_TLS_CA"]).parent / "both.pem"
    both.write_text(Path(tls_store["rank0"]["PYCOLL_TLS_CA"]).read_text()
                    + Path(tls_store["stranger"]["PYCOLL_TLS_CA"]).read_text())
    env = _rank_env(tls_store, PYCOLL_TRANSPORTS="tcp")
    env[bad] = {**tls_store["stranger"], "PYCOLL_TLS_CA": str(both), "PYCOLL_TRANSPORTS": "tcp"}
    monkeypatch.setenv("PYCOLL_TLS_CA", str(both))     # the store trusts both
    start = time.monotonic()
    outcomes = run_ranks(_allreduce_once, 2, rank_env=env, expect_failure=True, timeout=60,
                         collective_timeout=20)
    assert time.monotonic() - start < 40, outcomes
    reason = "not signed by this process's CA" if bad == 0 else "refused this process's cert"
    for rank, kind in ((1, "TransportError"), (0, "Aborted")):
        _fails_naming(outcomes, rank, kind, "rank 1 could not connect to peer rank 0",
                      "TLS handshake failed", reason, "PYCOLL_TLS_CA")


def _stranger_then_collectives(comm):
    """Rank 1 opens plain sockets to rank 0's TLS data port (garbage, and a HELLO with the
    right proof), then both ranks run collectives until rank 0 has dropped both (or 15 s)."""
    strangers = []
    if comm.rank == 1:
        addr = comm._conn._address(0)["tcp"]
        hello = HELLO.pack(MAGIC, 1, 0, 1, proof(TOKEN, str(addr["nonce"]), 1, 0, 1))
        for data in (b"GET / HTTP/1.0\r\n\r\n", hello):
            s = socket.create_connection((addr["host"], addr["port"]), timeout=5)
            s.sendall(data)
            s.setblocking(False)
            strangers.append(s)
    answers: list[bytes | None] = [None] * len(strangers)
    deadline = time.monotonic() + 15
    rounds = 0
    while True:
        a = np.full(1 << 18, comm.rank + 1, np.float32)
        comm.allreduce(a)
        assert a[0] == 3 and a[-1] == 3
        rounds += 1
        for i, s in enumerate(strangers):
            if answers[i] is None:
                try:
                    chunk = s.recv(4096)
                    answers[i] = chunk          # b"": closed by rank 0
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    answers[i] = b""
        done = np.array([all(x is not None for x in answers) or time.monotonic() > deadline],
                        np.int32)
        comm.broadcast(done, 1)
        if done[0]:
            break
    return {"answers": answers, "rounds": rounds, "channel": type(comm.channel(1 - comm.rank))
            .__name__}


def test_a_plain_stranger_on_a_tls_data_port_is_dropped(tls_store):
    env = _rank_env(tls_store, PYCOLL_TRANSPORTS="tcp")
    results = run_ranks(_stranger_then_collectives, 2, rank_env=env, timeout=90)
    answers = results[1]["answers"]
    assert len(answers) == 2 and None not in answers, results[1]     # both dropped
    for got in answers:
        # nothing but, perhaps, a TLS alert record (content type 21): never the ack b"\x01"
        assert got == b"" or got[0] == 21, got
    assert results[0]["channel"] == results[1]["channel"] == "TlsChannel"


def _nothing(comm):
    return comm.rank


@pytest.mark.parametrize("unset", ["PYCOLL_TLS_KEY", "PYCOLL_TLS_CA"])
def test_some_variables_but_not_all_fail_init_on_every_rank(certs, unset):
    env = dict(certs["rank0"], PYCOLL_TRANSPORTS="tcp")
    env.pop(unset)
    outcomes = run_ranks(_nothing, 2, env=env, expect_failure=True, timeout=30)
    for rank in range(2):
        _fails_naming(outcomes, rank, "InvalidArgument", unset, "PYCOLL_TLS_CERT")


def test_a_missing_file_fails_init_naming_it(certs, tmp_path):
    env = dict(certs["rank0"], PYCOLL_TRANSPORTS="tcp",
               PYCOLL_TLS_KEY=str(tmp_path / "absent.key"))
    outcomes = run_ranks(_nothing, 2, env=env, expect_failure=True, timeout=30)
    for rank in range(2):
        _fails_naming(outcomes, rank, "InvalidArgument", "PYCOLL_TLS_KEY", "absent.key")


LAUNCHED = """
import os, ssl, numpy as np, pycoll
comm = pycoll.init(timeout=30)
a = np.ones(1 << 18, np.float32)
comm.allreduce(a)
lanes = comm.channel(1 - comm.rank)._lanes
line = (f"rank {comm.rank} {float(a[0])} {isinstance(comm._store._sock, ssl.SSLSocket)} "
        f"{[s.version() for s in (lane.sock for lane in lanes)]}\\n")
os.write(1, line.encode())     # one write: the two ranks share the launcher's stdout
pycoll.finalize()
"""


def _launch(tmp_path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(LAUNCHED)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOLL_", "MASTER_"))}
    clean.update(PYTHONPATH=str(ROOT), PYCOLL_TRANSPORTS="tcp", **env)
    return subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "2", str(script)],
                          cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=90,
                          start_new_session=True)


def test_the_launcher_hosts_a_tls_store_for_its_ranks(certs, tmp_path):
    done = _launch(tmp_path, certs["rank0"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for rank in range(2):
        assert f"rank {rank} 2.0 True ['TLSv1.3']" in done.stdout, done.stdout


def test_the_launcher_refuses_some_variables_before_starting_anything(certs, tmp_path):
    env = dict(certs["rank0"])
    env.pop("PYCOLL_TLS_CA")
    done = _launch(tmp_path, env)
    assert done.returncode != 0
    assert "PYCOLL_TLS_CA" in done.stderr and "rank 0" not in done.stdout, done.stderr[-2000:]


def _one_rank_dies(comm):
    a = np.ones(1 << 18, np.float32)
    comm.allreduce(a)                  # the TLS channel is up
    if comm.rank == 1:
        os._exit(3)                    # gone without a word (no TLS close_notify either)
    got = np.empty(1 << 18, np.float32)
    comm.recv(got, 1, tag=9)


def test_a_peer_that_dies_on_a_tls_channel_is_lost_not_waited_for(tls_store):
    env = _rank_env(tls_store, PYCOLL_TRANSPORTS="tcp")
    start = time.monotonic()
    outcomes = run_ranks(_one_rank_dies, 2, rank_env=env, expect_failure=True, timeout=60,
                         collective_timeout=30)
    assert time.monotonic() - start < 20, outcomes          # well before the deadline
    _fails_naming(outcomes, 0, "PeerLost", "peer rank 1")


def _windows(comm):
    """One-sided windows over TLS (tcp's emulation: request and reply frames on the TLS
    lanes; a large put or get is striped over every lane)."""
    n = (1 << 20) + 3
    peer = 1 - comm.rank
    buf = np.zeros(n, dtype=np.float32)
    with comm.window(buf) as win:
        win.put(np.arange(n, dtype=np.float32) + comm.rank, peer)
        win.fence()
        put_ok = bool(np.array_equal(buf, np.arange(n, dtype=np.float32) + peer))
        win.fence()
        got = np.empty(n, dtype=np.float32)
        win.get(got, peer)
        win.fence()                      # every get is in before anyone changes a window
        win.accumulate(np.ones(n, dtype=np.float32), 0)
        win.fence()
        acc_ok = comm.rank == 1 or bool(np.array_equal(buf, np.arange(n, dtype=np.float32) + 3))
    return put_ok, bool(np.array_equal(got, np.arange(n, dtype=np.float32) + comm.rank)), acc_ok


@pytest.mark.parametrize("nsocks", ["1", "2"])
def test_windows_over_tls(tls_store, nsocks):
    env = _rank_env(tls_store, PYCOLL_TRANSPORTS="tcp", PYCOLL_SOCKET_NSOCKS=nsocks)
    for rank, res in enumerate(run_ranks(_windows, 2, rank_env=env, timeout=90)):
        assert all(res), (rank, res)
