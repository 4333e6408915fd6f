"""python -m pycoll.bench as real processes: standalone (-n), under python -m pycoll.run,
torchrun and mpiexec; -c catching a deliberately wrong result; files; errors."""
import json
import os

import pytest

from .helpers import (
    PY,
    bench,
    clean_env,
    free_port,
    parse_nccl_like_a_user,
    parse_osu_like_a_user,
    run,
)

pytestmark = pytest.mark.timeout(90)

def test_unknown_collective_exits_with_usage():
    r = bench("frobnicate", timeout=30)
    assert r.returncode == 2
    assert "usage:" in r.stderr and "unknown collective" in r.stderr


def test_unknown_option_exits_with_usage():
    r = bench("allreduce", "--no-such-flag", timeout=30)
    assert r.returncode == 2 and "usage:" in r.stderr


def test_help_lists_flags():
    r = bench("--help", timeout=30)
    assert r.returncode == 0
    for flag in ("-m", "-i", "-x", "-f", "-T", "-c", "-k", "-n", "--algo", "--transport",
                 "-o", "-d", "--json", "--csv", "--plot"):
        assert flag in r.stdout
    assert "corrupt" not in r.stdout          # the testing hook stays hidden


def test_standalone_osu_output_parses(tmp_path):
    r = bench("allreduce", "-n", "2", "-m", "8:4K", "-i", "20", "-x", "2", "-f", "-c",
              "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"))
    assert r.returncode == 0, r.stderr
    cols, rows = parse_osu_like_a_user(r.stdout)
    assert cols == ["Size", "Avg Latency(us)", "Min Latency(us)", "Max Latency(us)",
                    "Iterations", "algbw(GB/s)", "busbw(GB/s)", "Validation"]
    assert [row[0] for row in rows] == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert all(row[1] > 0 and row[-1] == "Pass" and row[4] == "20" for row in rows)
    assert "# Transport:" in r.stdout and "# Algorithm:" in r.stdout
    assert "Ranks: 2" in r.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert len(data["results"]) == 10 and data["meta"]["ranks"] == 2
    assert all(x["busbw_GBps"] == pytest.approx(x["algbw_GBps"]) for x in data["results"])
    assert (tmp_path / "r.csv").read_text().count("\n") == 11
    # only rank 0 prints the table
    assert r.stdout.count("# Size") == 1


def test_standalone_nccl_format_parses_three_ranks():
    r = bench("allreduce", "-n", "3", "-m", "4:1K", "-i", "10", "-x", "1", "-c",
              "--format", "nccl", "-T", "int32")
    assert r.returncode == 0, r.stderr
    rows, avg = parse_nccl_like_a_user(r.stdout)
    assert [x["size"] for x in rows] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert all(x["type"] == "int32" and x["redop"] == "sum" and x["wrong"] == "0" for x in rows)
    for x in rows:   # busbw = algbw * 2(n-1)/n, within the printed rounding
        assert x["busbw"] == pytest.approx(x["algbw"] * 4 / 3, abs=0.011)
    assert avg is not None and r.stdout.count("#  Rank") == 3


@pytest.mark.parametrize("how", ["flag", "env"])
def test_validation_catches_wrong_result(how):
    args = ["allreduce", "-n", "2", "-m", "8:64", "-i", "5", "-x", "1", "-c"]
    env = clean_env()
    if how == "flag":
        args += ["--corrupt-rank", "1"]
    else:
        env["PYCOLL_BENCH_CORRUPT_RANK"] = "1"
    r = bench(*args, env=env)
    assert r.returncode != 0
    cols, rows = parse_osu_like_a_user(r.stdout)
    assert rows and rows[0][-1] == "Fail"
    assert "DATA VALIDATION ERROR" in r.stderr
    assert "# Out of bounds values : 1 FAILED" in r.stdout


def test_under_pycoll_run():
    r = run([PY, "-m", "pycoll.run", "-n", "2", "-m", "pycoll.bench", "allreduce", "-m", "4:256",
             "-i", "10", "-x", "1", "-c", "--timing", "nccl"])
    assert r.returncode == 0, r.stderr
    cols, rows = parse_osu_like_a_user(r.stdout)
    assert [x[0] for x in rows] == [4, 8, 16, 32, 64, 128, 256]
    assert all(x[-1] == "Pass" for x in rows)


def test_plot_under_pycoll_run(tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (pip install "
                                             "'pycoll[bench]')")
    png = tmp_path / "p.png"
    r = run([PY, "-m", "pycoll.run", "-n", "2", "-m", "pycoll.bench", "allreduce", "-m", "4:64",
             "-i", "5", "-x", "1", "--plot", str(png)])
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_under_torchrun():
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    # pycoll's store would take MASTER_PORT + 1, which may be busy: give it its own port
    env = clean_env(PYCOLL_MASTER_PORT=str(free_port()))
    r = run([torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
             str(free_port()), "-m", "pycoll.bench", "allreduce", "-m", "8:64", "-i", "5",
             "-x", "1", "-c"], env=env, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    _, rows = parse_osu_like_a_user(r.stdout)
    assert [x[0] for x in rows] == [8, 16, 32, 64] and all(x[-1] == "Pass" for x in rows)


def test_under_mpiexec():
    mpiexec = os.path.join(os.path.dirname(PY), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("mpiexec (mpich wheel) not installed")
    env = clean_env(MASTER_PORT=str(free_port()), UCX_TLS="self,sm")
    r = run([mpiexec, "-launcher", "fork", "-hosts", "127.0.0.1", "-n", "2", PY, "-m",
             "pycoll.bench", "allreduce", "-m", "8:64", "-i", "5", "-x", "1", "-c"],
            env=env, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    _, rows = parse_osu_like_a_user(r.stdout)
    assert [x[0] for x in rows] == [8, 16, 32, 64] and all(x[-1] == "Pass" for x in rows)


@pytest.mark.parametrize("coll,extra", [
    ("broadcast", ["-k", "1"]), ("reduce", ["-k", "1"]), ("allgather", []),
    ("reduce_scatter", []), ("alltoall", []), ("gather", ["-k", "rotate"]),
    ("scatter", ["-k", "1"]), ("barrier", []), ("latency", []), ("bw", ["-W", "4"]),
])
def test_every_collective_validates(coll, extra):
    r = bench(coll, "-n", "2", "-m", "8:256", "-i", "5", "-x", "1", "-c", *extra)
    assert r.returncode == 0, r.stderr[-2000:]
    _, rows = parse_osu_like_a_user(r.stdout)
    assert rows and all(x[-1] == "Pass" for x in rows)


def test_allreduce_ops_and_dtypes():
    r = bench("allreduce", "-n", "2", "-m", "4:64", "-i", "3", "-x", "1", "-c", "-o", "all",
              "-T", "all", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    _, rows = parse_osu_like_a_user(r.stdout)
    assert rows and all(x[-1] == "Pass" for x in rows)
    assert r.stdout.count("# Datatype:") == 15       # 3 dtypes x 5 ops


def test_unknown_algorithm_is_a_clean_error():
    r = bench("allreduce", "-n", "2", "-m", "64", "--algo", "no_such_algo", "-i", "2", "-x", "0")
    assert r.returncode == 2
    assert "no_such_algo" in r.stderr and "Traceback" not in r.stderr
