"""TLS across two namespace hosts (one rank each, tcp between them, the store on host 0),
with certificates made by the test: every collective right, every socket TLS 1.3 (the store's
too), and a capture of host 1's wire (``wire_capture.py``) that finds the payload's marker
without TLS and never with it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pycoll.testing import free_port
from pycoll.testing.certs import make_job_certificates, openssl_available
from pycoll.testing.hosts import NamespaceHosts, available

from .jobs import _all_succeed, _rank_env, _reap, _results, _start

ok, why = available()
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not ok, reason=f"namespace hosts unavailable: {why}"),
              pytest.mark.skipif(not openssl_available(), reason="no openssl command")]
HERE = Path(__file__).parent
MARKER = "PYCOLL-CLEARTEXT-MARKER-0123456789"


def _job(hosts: NamespaceHosts, out: Path, tls: dict[int, dict[str, str]] | None) -> dict:
    """tls_job.py on both hosts while host 1's wire is captured: (results, capture)."""
    out.mkdir()
    stop = out / "stop"
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        capture = _start(hosts, 1, [sys.executable, str(HERE / "wire_capture.py"), MARKER,
                                    str(stop), "90"], _rank_env(hosts, 0, 0, 1, 2, port))
        procs.append(capture)
        assert capture.stdout is not None and capture.stdout.readline().strip() == "capturing"
        ranks = [_start(hosts, h, [sys.executable, str(HERE / "tls_job.py"), str(out), MARKER],
                        _rank_env(hosts, h, 0, 1, 2, port, PYCOLL_TOKEN="tls-hosts-secret",
                                  **(tls[h] if tls else {})))
                 for h in range(2)]
        procs += ranks
        _all_succeed(ranks, 100)
        stop.touch()
        seen = json.loads(capture.communicate(timeout=30)[0].strip().splitlines()[-1])
    finally:
        _reap(procs)
    return {"results": _results(out, 2), "capture": seen}


@pytest.fixture(scope="module")
def hosts():
    with NamespaceHosts(2) as h:
        yield h


def test_tls_between_two_hosts_and_nothing_in_the_clear(hosts, tmp_path):
    certs = make_job_certificates(tmp_path / "certs", ["pchost0", "pchost1"])
    plain = _job(hosts, tmp_path / "plain", None)
    secured = _job(hosts, tmp_path / "tls", {0: certs["pchost0"], 1: certs["pchost1"]})
    for run, tls in ((plain, False), (secured, True)):
        for res in run["results"]:
            assert all(res[k] for k in ("broadcast", "allreduce", "small", "sendrecv")), res
            assert res["transports"] == ["tcp"], res
            assert res["tls"] == (["TLSv1.3"] if tls else [None]), res
            assert res["store_tls"] is tls, res
    # the capture works (it sees the marker of the plain job: 1 MiB of it crossed) ...
    assert plain["capture"]["marker_frames"] > 0, plain["capture"]
    # ... and sees as many bytes of the TLS job, none of them the marker
    assert secured["capture"]["bytes"] > 1 << 20, secured["capture"]
    assert secured["capture"]["marker_frames"] == 0, secured["capture"]


def test_a_rank_of_another_ca_is_refused_by_the_store_with_a_clear_error(hosts, tmp_path):
    """Host 1's rank holds a certificate of another CA: rank 0's store refuses it at once;
    the rank says which store, why and what to set; rank 0 gives up at its init deadline
    naming the rank that never came, after the store's log line saying whose TLS handshake
    failed and why (no hang)."""
    job = make_job_certificates(tmp_path / "job", ["pchost0"])
    other = make_job_certificates(tmp_path / "other", ["pchost1"], ca_name="another-ca")
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    procs = []
    try:
        for h, files in ((0, job["pchost0"]), (1, other["pchost1"])):
            env = _rank_env(hosts, h, 0, 1, 2, port, PYCOLL_TOKEN="tls-hosts-secret", **files)
            code = "import pycoll; pycoll.init(timeout=15)"
            procs.append(_start(hosts, h, [sys.executable, "-c", code], env))
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        _reap(procs)
    assert all(p.returncode != 0 for p in procs), outs
    assert "AuthError" in outs[1] and "PYCOLL_TLS_CA" in outs[1], outs[1][-2000:]
    assert f"{hosts.addresses[0]}:{port + 1}" in outs[1], outs[1][-2000:]   # torchrun: +1
    # rank 0: the store's log line (host 1's address, the TLS failure), then the timeout
    # naming the rank that never came
    assert f"closing connection from {hosts.addresses[1]}" in outs[0], outs[0][-2000:]
    assert "TLS handshake failed" in outs[0] and "hello/1" in outs[0], outs[0][-2000:]
