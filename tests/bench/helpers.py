"""Helpers for tests/bench: run the bench as real processes, and independent output parsers.

The parsers here are deliberately written the way a user's script would parse OSU and
nccl-tests logs (not the ones in pycoll.bench.report), so the tests check the format itself.
"""
from __future__ import annotations

import os
import subprocess
import sys

from pycoll.testing import free_port  # noqa: F401 - re-exported for the tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable


def clean_env(**extra) -> dict:
    """The test process's environment minus any launcher variables (so -n relaunches)."""
    env = dict(os.environ)
    for k in list(env):
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                 "PYCOLL_BENCH_CORRUPT_RANK") or k.startswith("PYCOLL_"):
            del env[k]
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(args, timeout=60, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else clean_env(), cwd=cwd)


def bench(*args, timeout=60, env=None) -> subprocess.CompletedProcess:
    return run([PY, "-m", "pycoll.bench", *args], timeout=timeout, env=env)


# ---------------------------------------------------------------------------
# independent parsers
# ---------------------------------------------------------------------------
def parse_osu_like_a_user(text: str):
    """OSU log -> (header columns, rows).  Header: the '# Size' line split on 2+ spaces.
    Rows: lines not starting with '#': first field int size, second float latency/bandwidth."""
    import re
    header = None
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            if line.startswith("# Size"):
                header = re.split(r"\s{2,}", line[1:].strip())
            continue
        f = line.split()
        rows.append([int(f[0]), float(f[1]), *f[2:]])
    return header, rows


def parse_nccl_like_a_user(text: str):
    """nccl-tests log -> (rows, avg busbw).  Data rows: 9 (or 13) fields not starting with '#';
    size=f[0], count=f[1], type=f[2], redop=f[3], root=f[4], time=f[5], algbw=f[6],
    busbw=f[7], #wrong=f[8]."""
    rows = []
    avg = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# Avg bus bandwidth"):
            avg = float(s.split(":")[1])
        if not s or s.startswith("#"):
            continue
        f = s.split()
        assert len(f) in (9, 13), f"unexpected nccl-tests row: {line!r}"
        rows.append({"size": int(f[0]), "count": int(f[1]), "type": f[2], "redop": f[3],
                     "root": int(f[4]), "time": float(f[5]), "algbw": float(f[6]),
                     "busbw": float(f[7]), "wrong": f[8]})
    return rows, avg


def benchmark_module(script: str):
    """benchmarks/<script>.py, imported as a module (it is a script, not a package member)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"bench_{script}",
                                                  os.path.join(ROOT, "benchmarks", f"{script}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compare_module():
    return benchmark_module("compare")
