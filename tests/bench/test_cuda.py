"""``-d cuda``: a prompt, clear refusal where no GPU is visible; the D2D copy ceiling's
arithmetic and formatting from given numbers; its timing loop on the CPU; and, on a machine
with a CUDA GPU (skipped elsewhere), a real ``-d cuda`` run with the D2D line."""
import json
import subprocess
import sys

import pytest

from pycoll.bench import ceiling, report
from pycoll.bench.backend import cuda_unavailable_reason, local_rank
from pycoll.bench.cli import add_ceiling, mark_row

from .helpers import (
    PY,
    ROOT,
    bench,
    compare_module,
    parse_nccl_like_a_user,
    parse_osu_like_a_user,
    run,
)

pytestmark = pytest.mark.timeout(120)

try:
    import torch
    HAS_CUDA = torch.cuda.is_available()
except ImportError:     # pragma: no cover - torch is a test dependency here
    torch = None
    HAS_CUDA = False

needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
no_gpu = pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA GPU")


# ---------------------------------------------------------------------------
# no GPU: stop at once, one clear line
# ---------------------------------------------------------------------------
@no_gpu
@pytest.mark.timeout(60)
def test_cuda_without_a_gpu_exits_at_once_with_one_clear_line():
    r = bench("allreduce", "-d", "cuda", "-n", "2", "-m", "1K", timeout=45)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr            # refused before any rank started
    assert lines[0].startswith("pycoll.bench: -d cuda")
    assert ("no CUDA device is visible" in lines[0] or "torch is not installed" in lines[0]
            or "cannot use CUDA buffers" in lines[0])
    assert "-d cpu works" in lines[0] and "Traceback" not in r.stderr
    assert r.stdout == ""                        # no table, no header


@no_gpu
@pytest.mark.timeout(60)
def test_cuda_without_a_gpu_under_a_launcher_stops_every_rank():
    """Under pycoll.run each rank checks before pycoll.init(): no rank waits for another."""
    r = run([PY, "-m", "pycoll.run", "-n", "2", "-m", "pycoll.bench", "allreduce", "-d", "cuda",
             "-m", "1K"], timeout=45)
    assert r.returncode != 0
    assert "no CUDA device is visible" in r.stderr or "torch is not installed" in r.stderr
    assert "Traceback" not in r.stderr and "# Size" not in r.stdout


@no_gpu
def test_reason_names_the_missing_device():
    why = cuda_unavailable_reason()
    assert why and "\n" not in why and "-d cpu works" in why


def test_local_rank_from_the_launchers_variables():
    assert local_rank({}) == 0
    assert local_rank({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                       "LOCAL_WORLD_SIZE": "2"}) == 1
    ompi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert local_rank(dict(ompi, MASTER_ADDR="10.0.0.1")) == 2
    assert local_rank(ompi) == 2        # incomplete for init(), still names the local rank


# ---------------------------------------------------------------------------
# ceiling arithmetic and formatting, from given numbers (no GPU)
# ---------------------------------------------------------------------------
def test_copies_per_rep_and_median():
    assert ceiling.copies_per_rep(1) == 100                  # capped
    assert ceiling.copies_per_rep(1 << 20) == 64             # 64 MiB per repetition
    assert ceiling.copies_per_rep(64 << 20) == 1
    assert ceiling.copies_per_rep(1 << 30) == 1
    # 4 copies of 1 GB: 2 s, 4 s (median), 8 s -> 2 GB/s... 1 GB/s... 0.5 GB/s
    assert ceiling.median_gbps(10**9, 4, [8.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert ceiling.median_gbps(10**9, 1, [0.0, 0.5]) == pytest.approx(2.0)   # 0 s ignored
    with pytest.raises(ValueError):
        ceiling.median_gbps(8, 1, [0.0])


def test_pct_of():
    assert ceiling.pct_of(150.0, 1500.0) == pytest.approx(10.0)
    assert ceiling.pct_of(0.0, 1500.0) == 0.0
    assert ceiling.pct_of(1.0, None) is None
    assert ceiling.pct_of(1.0, 0.0) is None
    assert ceiling.pct_of(1.0, float("nan")) is None


def _cuda_rows():
    rows = []
    for size, avg in ((8, 20.0), (1 << 20, 100.0), (512 << 20, 4000.0)):
        algbw = size / (avg * 1e-6) / 1e9
        rows.append({"library": "pycoll", "collective": "allreduce", "ranks": 2, "size": size,
                     "requested_size": size, "count": size // 4, "dtype": "float32",
                     "op": "sum", "root": -1, "algorithm": "ring", "timing": "osu",
                     "iterations": 10, "warmup": 1, "avg_us": avg, "min_us": avg,
                     "max_us": avg, "p50_us": avg, "p99_us": avg, "iter_min_us": avg,
                     "iter_max_us": avg, "algbw_GBps": algbw, "busbw_GBps": algbw,
                     "bandwidth_MBps": None, "validation": "Pass", "wrong": 0})
    return rows


CEILING = {"GBps": 1342.177, "bytes": 512 << 20, "reps": 5, "copies": 1,
           "per_rank_GBps": [1342.177, 1350.0], "error": None}


def _cuda_meta():
    meta = {"collective": "allreduce", "ranks": 2, "library": "pycoll", "version": "0.1.0",
            "transport": "shm", "algorithm": "ring", "timing": "osu", "device": "cuda",
            "pids": [(100, "h"), (101, "h")], "validate": True}
    add_ceiling(meta, CEILING, ["cuda:0 NVIDIA H100 80GB HBM3", "cuda:1 NVIDIA H100 80GB HBM3"])
    return meta


def test_osu_table_with_d2d_column():
    meta = _cuda_meta()
    rows = [mark_row(r, meta["d2d_copy_GBps"]) for r in _cuda_rows()]
    # 512 MiB in 4000 us = 134.2177 GB/s = 10.00 % of 1342.177 GB/s
    assert rows[2]["busbw_pct_d2d"] == pytest.approx(10.0, rel=1e-6)
    lines = report.osu_preamble(meta)
    lines += report.osu_block_header("allreduce", "float32", "sum", False, True, d2d=True)
    lines += [report.osu_row(r, False, True) for r in rows]
    lines += report.summary_lines(rows)
    text = "\n".join(lines)
    assert ("# D2D copy: 1342.18 GB/s (dst.copy_(src) of 512MiB within the rank's GPU, median "
            "of 5; slowest of 2 ranks, fastest 1350.00; bytes copied / time)") in lines
    assert "# Ranks: 2  Device: cuda (cuda:0, cuda:1 NVIDIA H100 80GB HBM3)" in text
    cols, parsed = parse_osu_like_a_user(text)
    assert cols == ["Size", "Avg Latency(us)", "algbw(GB/s)", "busbw(GB/s)", "%d2d",
                    "Validation"]                     # Validation stays last
    assert [p[4] for p in parsed] == ["0.00", "0.78", "10.00"]
    assert all(p[-1] == "Pass" for p in parsed)
    assert report.parse_osu(text)[1]["%d2d"] == 0.78
    assert lines[-1] == ("# Peak bus bandwidth   : 134.218 GB/s at 512MiB = 10.00% of "
                         "D2D copy 1342.18 GB/s")


def test_nccl_table_keeps_nccl_tests_rows_and_adds_summary():
    meta = _cuda_meta()
    rows = [mark_row(r, meta["d2d_copy_GBps"]) for r in _cuda_rows()]
    lines = report.nccl_preamble(meta, [r["size"] for r in rows])
    lines += report.nccl_column_header() + [report.nccl_row(r) for r in rows]
    lines += report.nccl_epilogue(meta, rows)
    text = "\n".join(lines)
    parsed, avg = parse_nccl_like_a_user(text)     # still 9 fields per row
    assert len(parsed) == 3 and avg is not None
    assert "#  Rank  1 Group  0 Pid    101 on          h device  1 [cuda:1] NVIDIA H100" in text
    assert any(ln.startswith("# D2D copy: 1342.18 GB/s") for ln in lines)
    assert "= 10.00% of D2D copy 1342.18 GB/s" in text


def test_ceiling_not_measured_is_said_and_cells_are_na():
    meta = {"collective": "allreduce", "ranks": 2, "device": "cuda"}
    add_ceiling(meta, dict(CEILING, GBps=None, per_rank_GBps=[1300.0, float("nan")],
                           error="not measured on rank(s) 1"))
    assert report.d2d_line(meta) == "# D2D copy: not measured (not measured on rank(s) 1)"
    row = mark_row(_cuda_rows()[0], None)
    assert row["busbw_pct_d2d"] is None
    assert report.osu_row(row, False, False).split()[-1] == "N/A"
    assert report.d2d_summary([row]) == []


def test_json_and_csv_carry_the_ceiling(tmp_path):
    meta = _cuda_meta()
    rows = [mark_row(r, meta["d2d_copy_GBps"]) for r in _cuda_rows()]
    report.write_json(str(tmp_path / "r.json"), meta, rows)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["meta"]["d2d_copy_GBps"] == pytest.approx(1342.177)
    assert data["meta"]["d2d_copy"]["bytes"] == 512 << 20
    assert data["results"][2]["busbw_pct_d2d"] == pytest.approx(10.0)
    assert data["results"][2]["d2d_copy_GBps"] == pytest.approx(1342.177)
    csv_text = report.csv_text(rows)
    assert csv_text.splitlines()[0].endswith(",d2d_copy_GBps,busbw_pct_d2d")


def test_cpu_rows_are_unchanged():
    """Without -d cuda nothing about the ceiling appears."""
    r = _cuda_rows()[0]
    assert "%d2d" not in report.osu_column_header("allreduce", True, True)
    assert len(report.osu_row(r, False, False).split()) == 4
    assert report.summary_lines([r])[-1].startswith("# Avg bus bandwidth")


# ---------------------------------------------------------------------------
# the timing loop itself, on the CPU (the CUDA path differs only in using CUDA events)
# ---------------------------------------------------------------------------
_COPY_LOOP = """
import json, numpy as np
from pycoll.bench import ceiling
class OneRank:
    rank, world_size = 0, 1
    def barrier(self):
        pass
    def allgather_floats(self, values):
        return np.array([values], dtype=np.float64)
got = ceiling.d2d_copy_bandwidth(1 << 20, device="cpu", reps=3)
c = ceiling.measure_ceiling(OneRank(), 4096, reps=2, device="cpu")
bad = ceiling.measure_ceiling(OneRank(), 4096, reps=2, device="no-such-device")
print(json.dumps({"got": got, "c": c, "bad": bad}))
"""


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_copy_loop_on_the_cpu():
    # In a child process: torch ops started here would leave torch's thread pool in this
    # test process, and ranks forked from it by later tests hang in torch kernels.
    out = subprocess.run([sys.executable, "-c", _COPY_LOOP], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    got, c, bad = r["got"], r["c"], r["bad"]
    assert got["bytes"] == 1 << 20 and got["copies"] == 64 and got["reps"] == 3
    assert got["device"] == "cpu" and len(got["seconds"]) == 3 and got["GBps"] > 0
    assert c["error"] is None and c["GBps"] == c["per_rank_GBps"][0] > 0
    assert bad["GBps"] is None and "rank(s) 0" in bad["error"]


# ---------------------------------------------------------------------------
# compare.py --device
# ---------------------------------------------------------------------------
def test_compare_device_option_and_d2d_column():
    c = compare_module()
    assert c.parse_args([]).device == "cpu"
    a = c.parse_args(["--device", "cuda", "--libs", "pycoll,gloo", "--collectives", "allreduce"])
    assert a.device == "cuda"
    why = c.available("gloo", PY, "cuda")
    assert why and "device" in why
    if not HAS_CUDA:
        why = c.available("pycoll", PY, "cuda")
        assert why and "-d cpu works" in why
    rows = [dict(r, library="pycoll", d2d_copy_GBps=g) for r, g in
            zip(_cuda_rows(), (1300.0, 1342.177, 1400.0))]
    agg = c.aggregate(rows)
    machine = {"date": "d", "host": "h", "nproc": 2, "cpu": "c", "memory_GiB": 1,
               "kernel": "k", "loadavg_start": (0, 0, 0), "git": "g",
               "gpus": ["NVIDIA H100 80GB HBM3"]}
    md = c.markdown(a, machine, agg, ["pycoll"], {"gloo": why or "x"}, [], {}, 1.0)
    assert "- GPUs: NVIDIA H100 80GB HBM3" in md
    assert "median over jobs 1342.2 GB/s" in md
    head = next(ln for ln in md.splitlines() if ln.startswith("| size"))
    assert head.endswith("| D2D copy (GB/s) | pycoll %d2d |")
    row = next(ln for ln in md.splitlines() if ln.startswith("| 512MiB"))
    assert row.endswith("| 1400.0 | 9.59 |"), row            # 134.2177 / 1400


# ---------------------------------------------------------------------------
# a real GPU
# ---------------------------------------------------------------------------
@needs_gpu
@pytest.mark.timeout(300)
def test_cuda_run_reports_d2d(tmp_path):
    r = bench("allreduce", "-d", "cuda", "-n", "2", "-m", "8:1M", "-i", "5", "-x", "1", "-c",
              "--json", str(tmp_path / "r.json"), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Device: cuda (cuda:" in r.stdout
    d2d = [ln for ln in r.stdout.splitlines() if ln.startswith("# D2D copy: ")]
    assert len(d2d) == 1 and "GB/s" in d2d[0], r.stdout
    cols, rows = parse_osu_like_a_user(r.stdout)
    assert cols[-2:] == ["%d2d", "Validation"]
    assert rows and all(x[-1] == "Pass" for x in rows)
    assert "# Peak bus bandwidth" in r.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["meta"]["d2d_copy_GBps"] > 0
    assert data["meta"]["d2d_copy"]["bytes"] == 1 << 20
    assert all(x["busbw_pct_d2d"] is not None for x in data["results"])


@needs_gpu
@pytest.mark.timeout(300)
def test_cuda_run_nccl_format():
    r = bench("reduce_scatter", "-d", "cuda", "-n", "2", "-m", "1K:64K", "-i", "3", "-x", "1",
              "-c", "--format", "nccl", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    rows, avg = parse_nccl_like_a_user(r.stdout)
    assert rows and all(x["wrong"] == "0" for x in rows)
    assert "# D2D copy: " in r.stdout and "of D2D copy" in r.stdout
