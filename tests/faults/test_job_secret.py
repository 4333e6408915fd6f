"""Jobs started without PYCOLL_TOKEN are authenticated anyway (hardening, item 3).

Before, under torchrun or mpiexec without PYCOLL_TOKEN, a stranger who reached the store read
rank 0's nonce, forged the data-port proof with the empty key, joined as rank 1 and fed rank 0
wrong results, or posted a forged abort record. Now rank 0 draws a secret and shares it over
the launcher's own channel (MPI under mpiexec, torchrun's store under torchrun), every rank
on one host listens on loopback only, and a job that is still open says so at init.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pycoll.launch import resolve_launch
from pycoll.launch.secret import warn_if_open
from pycoll.testing import free_port

pytestmark = pytest.mark.timeout(120)
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]

JOB = """
import json, os, sys, time
import numpy as np
import pycoll
comm = pycoll.init(timeout=60)
out = sys.argv[1]
if comm.rank == 0:
    store = comm._store
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    with open(os.path.join(out, "store.json.tmp"), "w") as f:
        json.dump({"host": store.host, "port": store.port}, f)
    os.replace(os.path.join(out, "store.json.tmp"), os.path.join(out, "store.json"))
comm.barrier()
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(out, "stranger.done")) and time.monotonic() < deadline:
    time.sleep(0.05)
a = np.full(4, comm.rank + 1.0)
comm.allreduce(a)
print("RESULT", comm.rank, a.tolist(), flush=True)
"""


def _stranger(out: Path) -> dict:
    """What a stranger without the secret can do to the job's store."""
    import json

    from rendezvous import StoreError, TCPStore
    deadline = time.monotonic() + 60
    while not (out / "store.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    addr = json.loads((out / "store.json").read_text())
    seen: dict = {"addr": addr}
    try:
        client = TCPStore(addr["host"], addr["port"], token="", timeout=3)
        client.set("pycoll/world/abort", '{"rank": 1, "error": "forged"}')
        seen["write"] = "accepted"
        client.close()
    except (StoreError, OSError) as e:
        seen["write"] = f"refused: {type(e).__name__}: {e}"
    (out / "stranger.done").write_text("1")
    return seen


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOLL_", "MASTER_"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return env


def _run(cmd: list[str], env: dict, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    job = out / "job.py"
    job.write_text(JOB)
    proc = subprocess.Popen(cmd + [str(job), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        seen = _stranger(out)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(10)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), seen


def _check(result: subprocess.CompletedProcess, seen: dict) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert out.count("RESULT") == 2 and "[3.0, 3.0, 3.0, 3.0]" in out, out[-3000:]
    assert seen["write"].startswith("refused"), seen
    assert seen["addr"]["host"] in ("127.0.0.1", "localhost"), seen
    assert "has no secret" not in out, out[-3000:]


def test_torchrun_job_without_token_is_authenticated(tmp_path):
    if not (BIN / "torchrun").exists():
        pytest.skip("torchrun not installed")
    env = _env(PYCOLL_MASTER_PORT=str(free_port()))
    result, seen = _run([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-addr",
                         "127.0.0.1", "--master-port", str(free_port())], env, tmp_path)
    _check(result, seen)


def test_mpiexec_job_without_token_is_authenticated(tmp_path):
    if not (BIN / "mpiexec").exists():
        pytest.skip("mpiexec (mpich wheel) not installed")
    pytest.importorskip("mpi4py")
    env = _env(MASTER_PORT=str(free_port()), UCX_TLS="self,sm")
    result, seen = _run([str(BIN / "mpiexec"), "-launcher", "fork", "-hosts", "127.0.0.1", "-n",
                         "2", sys.executable], env, tmp_path)
    _check(result, seen)


def test_single_host_jobs_listen_on_loopback_only():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "10.20.30.40", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
    assert resolve_launch(env=env).master_addr == "127.0.0.1"
    env["LOCAL_WORLD_SIZE"] = "2"             # two hosts: the address is what it says
    assert resolve_launch(env=env).master_addr == "10.20.30.40"


def test_open_job_warns_loudly(caplog):
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "10.20.30.40", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}
    info = resolve_launch(env=env)
    with caplog.at_level(logging.WARNING, logger="pycoll"):
        warn_if_open(info, None, "none")
    text = caplog.text
    assert "no secret" in text and "PYCOLL_TOKEN" in text and "wrong results" in text, text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pycoll"):
        warn_if_open(info, "secret", "PYCOLL_TOKEN")
    assert caplog.text == ""
