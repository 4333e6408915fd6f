"""OSU / nccl-tests formatting, parsers, JSON/CSV writers and plots (no processes)."""
import csv
import json
import os

import pytest

from pycoll.bench import report
from pycoll.bench.collectives import busbw_factor

from .helpers import parse_nccl_like_a_user, parse_osu_like_a_user

pytestmark = pytest.mark.timeout(60)


def _rows(coll="allreduce", n=2, validation=None):
    rows = []
    for i, size in enumerate([8, 1024, 1 << 20, 512 << 20]):
        avg = 10.0 * (i + 1) + 0.123
        algbw = size / (avg * 1e-6) / 1e9
        rows.append({"library": "pycoll", "collective": coll, "ranks": n, "size": size,
                     "requested_size": size, "count": size // 4, "dtype": "float32",
                     "op": "sum", "root": -1, "algorithm": "ring", "timing": "osu",
                     "iterations": 1000 if size <= 8192 else 100, "warmup": 10,
                     "avg_us": avg, "min_us": avg - 1, "max_us": avg + 1, "p50_us": avg,
                     "p99_us": avg, "iter_min_us": 1.0, "iter_max_us": 99.0,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(coll, n),
                     "bandwidth_MBps": algbw * 1e3 if coll == "bw" else None,
                     "validation": validation, "wrong": None if validation is None else
                     (0 if validation == "Pass" else 3)})
    return rows


META = {"collective": "allreduce", "ranks": 2, "library": "pycoll", "version": "0.1.0",
        "transport": "shm", "algorithm": "ring (8B-512MiB)", "timing": "osu", "device": "cpu",
        "pids": [(100, "h"), (101, "h")], "validate": True}


def _osu_text(full, validate, coll="allreduce", rows=None):
    rows = rows or _rows(coll, validation="Pass" if validate else None)
    lines = report.osu_preamble(dict(META, collective=coll))
    lines += report.osu_block_header(coll, "float32", "sum", full, validate)
    lines += [report.osu_row(r, full, validate) for r in rows]
    lines += report.summary_lines(rows)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("validate", [False, True])
def test_osu_layout(full, validate):
    text = _osu_text(full, validate)
    lines = text.splitlines()
    assert lines[0] == ""                                  # OSU prints an empty line first
    assert lines[1].startswith("# pycoll Allreduce Latency Test")
    assert "# Datatype: float32." in lines
    header = next(ln for ln in lines if ln.startswith("# Size"))
    # OMB: "%-10s" then FIELD_WIDTH (18) right-aligned: "# Size       Avg Latency(us)"
    assert header[:28] == "# Size       Avg Latency(us)"
    if full:
        assert header[28:64] == "   Min Latency(us)   Max Latency(us)"
        assert header[64:76] == "  Iterations"
    row = next(ln for ln in lines if ln and not ln.startswith("#"))
    assert row.startswith("8" + " " * 22 + "10.12")      # "%-10d%18.2f"
    cols, rows = parse_osu_like_a_user(text)
    expect = ["Size", "Avg Latency(us)"]
    if full:
        expect += ["Min Latency(us)", "Max Latency(us)", "Iterations"]
    expect += ["algbw(GB/s)", "busbw(GB/s)"] + (["Validation"] if validate else [])
    assert cols == expect
    assert [r[0] for r in rows] == [8, 1024, 1 << 20, 512 << 20]
    assert [r[1] for r in rows] == [10.12, 20.12, 30.12, 40.12]
    if validate:
        assert all(r[-1] == "Pass" for r in rows)
    parsed = report.parse_osu(text)
    assert [p["Size"] for p in parsed] == [8, 1024, 1 << 20, 512 << 20]
    assert parsed[2]["busbw(GB/s)"] == pytest.approx(_rows()[2]["busbw_GBps"], abs=1e-4)
    if full:
        assert parsed[0]["Iterations"] == 1000 and parsed[3]["Iterations"] == 100


def test_osu_pt2pt_headers():
    lat = report.osu_column_header("latency", False, False)
    assert lat.startswith("# Size          Latency (us)   ")      # OMB osu_latency
    bw = report.osu_column_header("bw", False, False)
    assert bw == "# Size      Bandwidth (MB/s)"                   # OMB osu_bw
    rows = _rows("bw")
    text = "\n".join([bw] + [report.osu_row(r, False, False) for r in rows])
    cols, parsed = parse_osu_like_a_user(text)
    assert cols == ["Size", "Bandwidth (MB/s)"]
    assert parsed[-1][1] == pytest.approx(rows[-1]["bandwidth_MBps"], abs=0.01)


def test_osu_parser_reads_real_omb_output():
    real = """
# OSU MPI Allreduce Latency Test v7.4
# Datatype: MPI_CHAR.
# Size       Avg Latency(us)     Min Latency(us)     Max Latency(us)  Iterations
1                       1.52                1.40                1.66        1000
2                       1.50                1.41                1.60        1000
"""
    rows = report.parse_osu(real)
    assert rows[1] == {"Size": 2, "Avg Latency(us)": 1.5, "Min Latency(us)": 1.41,
                       "Max Latency(us)": 1.6, "Iterations": 1000}


def test_nccl_layout_and_parsers():
    rows = _rows(validation="Pass")
    lines = report.nccl_preamble(META, [r["size"] for r in rows])
    lines += report.nccl_column_header()
    lines += [report.nccl_row(r) for r in rows]
    lines += report.nccl_epilogue(META, rows)
    text = "\n".join(lines)
    assert "# Collective test starting: all_reduce_perf" in text
    assert "# Collective test concluded: all_reduce_perf" in text
    assert "#  Rank  1 Group  0 Pid    101" in text
    parsed, avg = parse_nccl_like_a_user(text)
    assert [p["size"] for p in parsed] == [r["size"] for r in rows]
    assert [p["count"] for p in parsed] == [r["count"] for r in rows]
    assert all(p["type"] == "float" and p["redop"] == "sum" and p["root"] == -1 for p in parsed)
    assert all(p["wrong"] == "0" for p in parsed)
    assert parsed[0]["time"] == 10.12            # %7.2f below 100 us
    assert avg == pytest.approx(sum(r["busbw_GBps"] for r in rows) / len(rows), rel=1e-5)
    mine = report.parse_nccl(text)
    assert mine["oob"] == 0 and len(mine["rows"]) == 4
    assert mine["rows"][3]["busbw"] == pytest.approx(rows[3]["busbw_GBps"], abs=0.01)


def test_nccl_time_format_and_non_reduction():
    r = dict(_rows()[0], avg_us=123456.7, op=None, wrong=None, root=2, collective="broadcast")
    line = report.nccl_row(r)
    f = line.split()
    assert f[3] == "none" and f[4] == "2" and f[5] == "123457" and f[8] == "N/A"
    assert report._nccl_time(1234.56) == " 1234.6"


def test_nccl_parser_reads_real_log():
    real = """# Collective test starting: all_reduce_perf
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
  1073741824     268435456     float     sum      -1   9306.7  115.37  115.37      0   9291.5  115.56  115.56      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 115.9
"""  # noqa: E501 (nccl-tests' own output, verbatim)
    p = report.parse_nccl(real)
    assert p["avg_busbw"] == 115.9 and p["oob"] == 0
    assert p["rows"][0]["busbw"] == 115.37 and p["rows"][0]["ip_busbw"] == 115.56


def test_json_and_csv_writers(tmp_path):
    rows = _rows(validation="Fail")
    jp, cp = tmp_path / "r.json", tmp_path / "r.csv"
    report.write_json(str(jp), META, rows)
    report.write_csv(str(cp), rows)
    data = json.loads(jp.read_text())
    assert data["meta"]["collective"] == "allreduce" and len(data["results"]) == 4
    assert data["results"][0]["validation"] == "Fail"
    with open(cp) as f:
        got = list(csv.DictReader(f))
    assert [int(g["size"]) for g in got] == [8, 1024, 1 << 20, 512 << 20]
    assert float(got[1]["busbw_GBps"]) == pytest.approx(rows[1]["busbw_GBps"])
    assert got[0]["wrong"] == "3" and got[0]["p50_us"] != ""


def test_plot_png(tmp_path):
    pytest.importorskip("matplotlib")
    from pycoll.bench.plot import plot_rows, plot_series
    p = plot_rows(_rows(), str(tmp_path / "a.png"), title="t")
    assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    p = plot_series({"x": [(8, 1.0, 0.1), (16, 2.0, 0.2)], "y": []}, str(tmp_path / "b.png"))
    assert os.path.getsize(p) > 1000
