"""The multi-node launcher's secret and node ranks against hostile input (issue 32, part 5):
a token file others can read, an empty or garbage one, another job's token, a stranger or a
second launcher joining as a node. Real launchers (``python -m pycoll.run``) on 127.0.0.1,
two "nodes" on one host; each is reaped if a test fails before it exits.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pycoll.testing import free_port

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
SECRET = "0123456789abcdef" * 2

JOB = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    import pycoll
    comm = pycoll.init(timeout=8)
    a = np.ones(4, np.float32)
    comm.allreduce(a)
    time.sleep(float(sys.argv[1]))
    print(f"rank {comm.rank} sum {a[0]:g} token {os.environ['PYCOLL_TOKEN']}", flush=True)
    pycoll.finalize()
""")


def _env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYCOLL_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if token is not None:
        env["PYCOLL_TOKEN"] = token
    return env


def _launcher(args: list[str], token: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pycoll.run", *args], env=_env(token),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(procs: list[subprocess.Popen], seconds: float = 60) -> list[tuple[int, str]]:
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=seconds)
            outs.append((p.returncode, out + err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    return outs


def _node(node_rank: int, port: int, job: Path, sleep: float = 0.0,
          extra: list[str] | None = None, token: str | None = SECRET) -> subprocess.Popen:
    return _launcher(["--nnodes", "2", "--node-rank", str(node_rank), "--master-addr",
                      "127.0.0.1", "--master-port", str(port), "-n", "1", "--timeout", "60",
                      *(extra or []), str(job), str(sleep)], token)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(JOB)
    return path


def _token_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("content,mode,says", [
    (SECRET.encode(), 0o644, "readable or writable by other users (mode 0644)"),
    (SECRET.encode(), 0o640, "chmod 600"),
    (b"", 0o600, "is empty"),
    (b"\n  \n", 0o600, "is empty"),
    (os.urandom(64).replace(b"\n", b"\0") + b"\xff", 0o600, "does not hold a secret"),
    (b"two words\n", 0o600, "does not hold a secret"),
    (None, 0o600, "No such file"),
], ids=["world-readable", "group-readable", "empty", "blank", "garbage", "spaces", "missing"])
def test_bad_token_file_is_a_usage_error(tmp_path, job, content, mode, says):
    """Before: a world-readable file was used as it was, an empty one was silently replaced
    by a fresh secret (on one host) and a binary one crashed the launcher with a
    UnicodeDecodeError traceback. Now each is a usage error (exit 2) naming the problem,
    before any rank or store starts."""
    path = tmp_path / "absent" if content is None else _token_file(tmp_path, content, mode)
    [(code, text)] = _finish([_launcher(["--token-file", str(path), "-n", "1", str(job), "0"])])
    assert code == 2 and says in text, text
    assert "Traceback" not in text, text


def test_good_token_file_reaches_the_ranks(tmp_path, job):
    path = _token_file(tmp_path, (SECRET + "\n").encode())
    [(code, text)] = _finish([_launcher(["--token-file", str(path), "-n", "2", str(job), "0"],
                                        token="not-this-one")])
    assert code == 0, text
    assert text.count(f"token {SECRET}") == 2, text


def test_node_with_another_jobs_token(job):
    """Node 1 holds another job's secret: node 0's store turns it away (its launcher says
    the token does not match and exits 1 at once); node 0's rank fails within its bootstrap
    deadline naming the key of the rank that never came, instead of waiting for ever."""
    port = free_port()
    node0 = _node(0, port, job)
    time.sleep(0.5)
    node1 = _node(1, port, job, token="f" * 32)
    (code0, text0), (code1, text1) = _finish([node0, node1])
    assert code1 == 1 and "token does not match" in text1, text1
    assert code0 != 0 and "rank(s) [1] (1 of 2) never joined" in text0, text0
    assert "authentication failed" in text0, text0


def test_second_launcher_and_stranger_joining_as_a_node(job):
    """A second launcher claiming node rank 1 (with the right secret) stops before starting
    a rank, naming the launcher that holds it; a stranger without the secret cannot even
    talk to the store. Before, the second launcher's rank collided with the first one's
    rank 1 and the whole job failed with PeerLost and "shared segment vanished" errors."""
    from rendezvous import TCPStore
    port = free_port()
    node0 = _node(0, port, job, sleep=3)
    node1 = _node(1, port, job, sleep=3)
    # first claim wins: the second launcher starts once the first one's claim is in the store
    # (after a fixed 1.5 s, a slow first launcher lost the race and was the one refused)
    with TCPStore("127.0.0.1", port, token=SECRET, timeout=60) as store:
        holder = bytes(store.get("pycoll-run/node/1")).decode()
    assert f"pid {node1.pid}," in holder, holder
    second = _node(1, port, job, sleep=3)
    refused = []
    for token in ("", "f" * 32):
        try:
            TCPStore("127.0.0.1", port, token=token, timeout=5).get("pycoll-run/node/1")
        except Exception as e:  # noqa: BLE001 - what the stranger is told
            refused.append(type(e).__name__)
    (code0, text0), (code1, text1), (code2, text2) = _finish([node0, node1, second])
    assert code2 == 1 and "node rank 1 of this job is already taken" in text2, text2
    assert f"taken by the launcher on {holder}" in text2, text2     # named: the first one
    assert "sum" not in text2, text2                     # it started no rank
    assert code0 == 0 and code1 == 0, (text0, text1)
    assert "rank 0 sum 2" in text0 and "rank 1 sum 2" in text1
    assert len(refused) == 2, refused
