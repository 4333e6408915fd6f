"""python -m pycoll.bench put|get|accumulate (and their bw forms): OSU's one-sided tests
(osu_put_latency, osu_get_bw, osu_put_bibw...) with flush synchronisation, as real
processes over shm and tcp, validated; and the MPI peer's ``MPI.Win`` runner."""
import json
import os

import pytest

from .helpers import PY, ROOT, bench, clean_env, parse_osu_like_a_user, run

pytestmark = pytest.mark.timeout(120)

MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")
TESTS = ("put", "put_bw", "put_bibw", "get", "get_bw", "accumulate")


@pytest.mark.parametrize("window_type", ["allocate", "create"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("name,title,column", [
    ("osu_put_latency", "MPI_Put Latency Test", "Latency (us)"),
    ("osu_get_bw", "MPI_Get Bandwidth Test", "Bandwidth (MB/s)"),
    ("osu_put_bibw", "MPI_Put Bi-directional Bandwidth Test", "Bandwidth (MB/s)"),
    ("accumulate", "MPI_Accumulate latency Test", "Latency (us)"),
])
def test_one_sided_tests_run_and_validate(transport, name, title, column, window_type):
    r = bench(name, "-n", "2", "-m", "8:4K", "-i", "5", "-x", "1", "-W", "4", "-c",
              "--transport", transport, "-w", window_type)
    assert r.returncode == 0, r.stderr[-3000:]
    cols, rows = parse_osu_like_a_user(r.stdout)
    assert cols[:2] == ["Size", column] and cols[-1] == "Validation"
    assert [row[0] for row in rows] == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert all(row[-1] == "Pass" for row in rows)
    # OSU prints two decimals: a loaded host's tcp get of 8 B (hundreds of us, each one
    # waiting for the target's progress thread) can print a bandwidth of 0.00 MB/s
    assert all(row[1] > 0 if column.startswith("Latency") else row[1] >= 0 for row in rows)
    assert title in r.stdout and f"# Transport: {transport}" in r.stdout
    assert "# Synchronization: flush" in r.stdout
    assert ("# Window creation: comm.allocate_window" if window_type == "allocate" else
            "# Window creation: comm.window") in r.stdout


def test_one_sided_validation_catches_a_wrong_result():
    r = bench("put", "-n", "2", "-m", "8:64", "-i", "3", "-x", "1", "-c",
              env=clean_env(PYCOLL_BENCH_CORRUPT_RANK="1"))
    assert r.returncode == 1 and "DATA VALIDATION ERROR" in r.stderr


def test_one_sided_tests_refuse_device_memory():
    r = bench("put", "-d", "cuda", timeout=30)
    assert r.returncode == 2 and "measure host windows" in r.stderr


@pytest.mark.parametrize("window_type", ["allocate", "create"])
def test_mpi_runner_one_sided_validates(window_type):
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py not installed")
    if not os.path.exists(MPIEXEC):
        pytest.skip("mpiexec (pip install mpich) not found")
    r = run([MPIEXEC, "-launcher", "fork", "-hosts", "127.0.0.1", "-n", "2", PY,
             os.path.join(ROOT, "benchmarks", "peers", "mpi_runner.py"), "--collectives",
             ",".join(TESTS), "-m", "8:256", "-i", "3", "-x", "1", "-W", "4", "-c",
             "-w", window_type],
            env=clean_env(UCX_TLS="self,sm"), timeout=110)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")][1:]
    assert {x["collective"] for x in rows} == set(TESTS)
    assert all(x["validation"] == "Pass" and x["library"] == "mpi" for x in rows), rows
