"""pycoll.init() from every launcher's environment, end to end, in real subprocesses."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import pytest

from pycoll.testing import free_port, same_host_transport

SCRIPT = textwrap.dedent("""
    import numpy as np, pycoll, os
    comm = pycoll.init(timeout=30)
    a = np.full(5, comm.rank + 1, dtype=np.int64)
    pycoll.allreduce(a)
    os.write(1, (f"RESULT rank={pycoll.get_rank()} size={pycoll.get_world_size()} "
                 f"sum={int(a[0])} transport={comm.transport_summary()}\\n").encode())
    pycoll.finalize()
""")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYCOLL_", "OMPI_", "PMI_", "SLURM_", "MPI_LOCAL"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT")}
    return env


def _run_ranks_with_env(tmp_path, size: int, make_env) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    procs = []
    try:
        for rank in range(size):
            env = _clean_env()
            env.update(make_env(rank))
            procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        outputs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outputs.append(out)
        return outputs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


LAUNCHER_ENVS = {
    "torchrun": lambda port, size: lambda r: {
        "RANK": str(r), "WORLD_SIZE": str(size), "LOCAL_RANK": str(r),
        "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
    "openmpi": lambda port, size: lambda r: {
        "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": str(size),
        "MASTER_PORT": str(port)},
    "mpich": lambda port, size: lambda r: {
        "PMI_RANK": str(r), "PMI_SIZE": str(size), "MPI_LOCALRANKID": str(r),
        "MPI_LOCALNRANKS": str(size), "MASTER_PORT": str(port)},
    "slurm": lambda port, size: lambda r: {
        "SLURM_PROCID": str(r), "SLURM_NTASKS": str(size), "SLURM_LOCALID": str(r),
        "SLURM_STEP_ID": "0",   # as srun sets it (a batch script without srun is refused)
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
}


@pytest.mark.parametrize("launcher", list(LAUNCHER_ENVS))
def test_init_from_launcher_environment(tmp_path, launcher):
    size = 3
    outputs = _run_ranks_with_env(tmp_path, size, LAUNCHER_ENVS[launcher](free_port(), size))
    for rank, out in enumerate(outputs):
        assert f"RESULT rank={rank} size=3 sum=6 transport={same_host_transport()}" in out


def test_explicit_arguments_and_tcp(tmp_path):
    port = free_port()
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.replace(
        "pycoll.init(timeout=30)",
        f"pycoll.init(int(os.environ['R']), 2, master_addr='127.0.0.1', master_port={port})"))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**_clean_env(), "R": str(r), "PYCOLL_TRANSPORTS": "tcp",
                                   "PYCOLL_DEBUG": "INFO"})
             for r in range(2)]
    try:
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (out, err) in enumerate(results):
        assert f"RESULT rank={rank} size=2 sum=3 transport=tcp" in out, err
        assert f"[pycoll rank {rank}] INFO" in err and "transports in use: tcp" in err  # logged


def test_pycoll_run_launcher(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "4", str(script)],
                          capture_output=True, text=True, timeout=90, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    for rank in range(4):
        assert (f"RESULT rank={rank} size=4 sum=10 transport={same_host_transport()}"
                in proc.stdout)


def test_no_shared_memory_left_after_killed_rank(tmp_path):
    """Segments are unlinked right after setup, so even kill -9 leaves nothing in /dev/shm."""
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent("""
        import os, signal, numpy as np, pycoll
        comm = pycoll.init(timeout=20)
        os.write(1, f"PIDFILE {os.getpid()}\\n".encode())  # one write: lines of ranks never mix
        a = np.ones(1 << 22, dtype=np.float32)
        pycoll.allreduce(a)
        if comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        pycoll.allreduce(a)
    """))
    proc = subprocess.run([sys.executable, "-m", "pycoll.run", "-n", "3", str(script)],
                          capture_output=True, text=True, timeout=90, env=_clean_env())
    assert proc.returncode != 0
    pids = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("PIDFILE")]
    assert len(pids) == 3, proc.stdout + proc.stderr
    leftovers = [f for pid in pids for f in glob.glob(f"/dev/shm/pycoll-{pid}-*")]
    assert leftovers == []
