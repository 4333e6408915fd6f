"""The optional measurements of python -m pycoll.bench, as real ranks, read back from --json:
-P (per-iteration percentiles), --check-every N (every iteration validated), --memory (peak
RSS, segment and registered bytes per rank), --nonblocking W (async window and overlap)."""
import json

import pytest

from pycoll.bench import report
from pycoll.bench.options import Modes, parse_args

from .helpers import bench, clean_env, parse_osu_like_a_user

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


def _run_json(tmp_path, *args, env=None, rc=0):
    out = tmp_path / "r.json"
    r = bench(*args, "--json", str(out), env=env, timeout=100)
    assert r.returncode == rc, r.stderr[-3000:]
    return r, json.loads(out.read_text())


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_percentiles_and_memory(tmp_path, transport):
    r, data = _run_json(tmp_path, "allreduce", "-n", "2", "-m", "8:4K", "-i", "30", "-x", "2",
                        "-P", "--memory", "--transport", transport)
    cols, rows = parse_osu_like_a_user(r.stdout)
    assert cols == ["Size", "Avg Latency(us)", "algbw(GB/s)", "busbw(GB/s)", "P50 Latency(us)",
                    "P99 Latency(us)", "Max Iter(us)", "Peak RSS(MiB)", "Segments(MiB)",
                    "Registered(MiB)"]
    assert len(rows) == 10 and all(len(row) == len(cols) for row in rows)
    assert data["meta"]["percentiles"] is True and data["meta"]["memory"] is True
    for x in data["results"]:
        assert 0 < x["tail_p50_us"] <= x["tail_p99_us"] <= x["tail_max_us"]
        # the slowest iteration of the slowest rank, whichever way it is found
        assert x["tail_max_us"] == pytest.approx(x["iter_max_us"])
        assert x["tail_p50_us"] >= x["iter_min_us"]
        assert 10 * MiB < x["peak_rss_bytes_min"] <= x["peak_rss_bytes_max"] < 4096 * MiB
        assert x["registered_bytes_min"] == x["registered_bytes_max"] == 0
        if transport == "tcp":      # sockets: no shared memory, nothing registered
            assert x["segment_bytes_min"] == x["segment_bytes_max"] == 0
        else:                       # the fast path's segment, or the channels' inboxes
            assert 0 < x["segment_bytes_min"] <= x["segment_bytes_max"] < 64 * MiB
    # the table shows the maxima, in MiB
    last = data["results"][-1]
    assert float(rows[-1][-3]) == pytest.approx(last["peak_rss_bytes_max"] / MiB, abs=0.006)
    assert float(rows[-1][-2]) == pytest.approx(last["segment_bytes_max"] / MiB, abs=0.006)


def test_memory_on_point_to_point(tmp_path):
    r, data = _run_json(tmp_path, "latency", "-n", "2", "-m", "8:64", "-i", "20", "-x", "2",
                        "--memory")
    cols, _ = parse_osu_like_a_user(r.stdout)
    assert cols[-3:] == ["Peak RSS(MiB)", "Segments(MiB)", "Registered(MiB)"]
    assert all(x["peak_rss_bytes_min"] > 10 * MiB for x in data["results"])


# A bit flipped in the 10th message of 64 bytes or more that rank 1 receives from rank 0:
# with -A recursive_doubling on tcp, each 1 KiB allreduce sends one, so iteration 9 (timed
# iteration 7 after 2 warm-up) is the one hit; the bench's own small messages (barrier,
# statistics before the loop) are shorter and not counted. The bit is one of the high exponent
# bits of a float32 (byte 3 of a 64-byte block): a random bit of the low byte is a change of a
# few ulp, within the check's tolerance, and made this test pass or fail by chance.
FLIP = "peer=0,nth=10,itemsize=64,bits=24-30,seed=7"
FLIP_RUN = ("allreduce", "-n", "2", "-m", "1K:1K", "-i", "20", "-x", "2", "--transport", "tcp",
            "-A", "recursive_doubling")


def test_check_every_catches_a_flip_that_c_misses(tmp_path):
    env = clean_env(PYCOLL_TEST_FLIP=FLIP)
    # -c checks one extra run after the timing: the flipped iteration goes unnoticed
    once = bench(*FLIP_RUN, "-c", env=env, timeout=100)
    assert once.returncode == 0, once.stderr[-3000:]
    assert parse_osu_like_a_user(once.stdout)[1][0][-1] == "Pass"

    r, data = _run_json(tmp_path, *FLIP_RUN, "--check-every", "1", env=env, rc=1)
    _, rows = parse_osu_like_a_user(r.stdout)
    assert rows[0][-1] == "Fail"
    line = next(ln for ln in r.stderr.splitlines()
                if ln.startswith("DATA VALIDATION ERROR: allreduce"))
    assert "on rank 1 of 2" in line
    assert "timed iteration 7 of 20 (iteration 9 counting 2 warm-up)" in line
    assert "element " in line and " expected " in line and " got " in line
    assert "first failing iteration 9" in r.stderr
    x = data["results"][0]
    assert x["validation"] == "Fail" and x["first_bad_iteration"] == 9
    assert x["failed_checks"] == 1 and x["wrong"] == 1 and x["checked_iterations"] == 22
    assert "# Out of bounds values : 1 FAILED" in r.stdout


def test_check_every_with_the_corrupting_hook(tmp_path):
    r, data = _run_json(tmp_path, "reduce_scatter", "-n", "2", "-m", "64", "-i", "6", "-x", "1",
                        "-C", "2", "--corrupt-rank", "0", rc=1)
    x = data["results"][0]
    # iterations 0, 2, 4 and 6 are checked; the hook spoils every check of rank 0
    assert x["checked_iterations"] == 4 and x["failed_checks"] == 4
    assert x["first_bad_iteration"] == 0
    assert "on rank 0 of 2, warm-up iteration 0 of 1" in r.stderr
    assert len(data["results"]) == 1                 # a failed size stops the sweep


@pytest.mark.parametrize("coll,extra", [
    ("allreduce", ["-o", "max"]), ("gather", ["-k", "rotate"]), ("alltoall", []),
    ("broadcast", ["-k", "1"]), ("allgather", ["-T", "int32"]), ("barrier", []),
])
def test_check_every_passes_on_correct_results(tmp_path, coll, extra):
    r, data = _run_json(tmp_path, coll, "-n", "2", "-m", "8:256", "-i", "5", "-x", "1",
                        "-C", "1", *extra)
    _, rows = parse_osu_like_a_user(r.stdout)
    assert rows and all(row[-1] == "Pass" for row in rows)
    for x in data["results"]:
        assert x["validation"] == "Pass" and x["wrong"] == 0 and x["failed_checks"] == 0
        assert x["first_bad_iteration"] is None and x["check_every"] == 1
        # barrier has no data to check; a gather's result is checked on its root, each
        # rank's turn every other iteration under -k rotate (the maximum over ranks)
        assert x["checked_iterations"] == {"barrier": 0, "gather": 3}.get(coll, 6)


def test_nonblocking_window_and_overlap(tmp_path):
    r, data = _run_json(tmp_path, "allreduce", "-n", "2", "-m", "1K:256K", "-i", "10", "-x", "1",
                        "--nonblocking", "4", "-c", "-P")
    cols, rows = parse_osu_like_a_user(r.stdout)
    assert cols == ["Size", "Avg Latency(us)", "algbw(GB/s)", "busbw(GB/s)", "Overall(us)",
                    "Compute(us)", "Pure Comm.(us)", "Overlap(%)", "P50 Latency(us)",
                    "P99 Latency(us)", "Max Iter(us)", "Validation"]
    assert all(row[-1] == "Pass" for row in rows)
    assert "# Non-blocking: 4 calls posted" in r.stdout
    for x in data["results"]:
        assert x["nonblocking"] == 4
        assert 0.0 <= x["overlap_pct"] <= 100.0
        assert x["pure_comm_us"] > 0 and x["compute_us"] > 0
        # the compute runs inside the window, so the window lasts at least as long
        assert x["overall_us"] >= x["compute_us"]
        # the table's latency is per call: a window's pure communication over W
        assert x["avg_us"] * 4 == pytest.approx(x["pure_comm_us"], rel=1e-6)
        assert 0 < x["tail_p50_us"] <= x["tail_p99_us"] <= x["tail_max_us"]


def test_nonblocking_rooted_rotate(tmp_path):
    _, data = _run_json(tmp_path, "broadcast", "-n", "3", "-m", "64:128", "-i", "6", "-x", "1",
                        "-k", "rotate", "--nonblocking", "2", "-c")
    assert [x["validation"] for x in data["results"]] == ["Pass", "Pass"]
    assert all(0.0 <= x["overlap_pct"] <= 100.0 for x in data["results"])


@pytest.mark.parametrize("args,words", [
    (["latency", "-P"], "point-to-point"),
    (["bw", "--nonblocking", "4"], "point-to-point"),
    (["allreduce", "-C", "1", "--timing", "nccl"], "--timing osu"),
    (["allreduce", "-P", "--timing", "nccl"], "--timing osu"),
    (["allreduce", "-C", "1", "--nonblocking", "2"], "choose one"),
    (["allreduce", "-C", "-1"], "--check-every must be"),
    (["allreduce", "--nonblocking", "-2"], "--nonblocking must be"),
])
def test_modes_refused_where_meaningless(capsys, args, words):
    with pytest.raises(SystemExit) as e:
        parse_args(args)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_modes_from_flags():
    assert parse_args(["allreduce"]).modes == Modes()
    o = parse_args(["allreduce", "-P", "-C", "3", "--memory"])
    assert o.modes == Modes(percentiles=True, check_every=3, memory=True)
    assert o.validate        # --check-every brings the Validation column
    assert o.modes.columns() == ("percentiles", "memory")
    assert parse_args(["allreduce", "--nonblocking", "8"]).modes.time_factor() == 16


def test_new_fields_only_with_their_flags():
    row = {k: None for k in report.CSV_FIELDS}
    row.update(collective="allreduce", size=8, avg_us=1.0, algbw_GBps=0.0, busbw_GBps=0.0)
    plain = report.csv_text([row])
    assert plain.splitlines()[0] == ",".join(report.CSV_FIELDS)
    marked = dict(row, tail_p50_us=1.5, tail_p99_us=2.0, tail_max_us=3.0)
    header = report.csv_text([marked]).splitlines()[0].split(",")
    assert header[-3:] == ["tail_p50_us", "tail_p99_us", "tail_max_us"]
    assert report.osu_row(row, False, False) == report.osu_row(row, False, False, ())
    cells = report.osu_row(row, False, False, ("percentiles",)).split()
    assert cells[-3:] == ["N/A", "N/A", "N/A"]


def test_help_lists_the_new_flags():
    from pycoll.bench.options import build_parser
    text = build_parser().format_help()
    for flag in ("-P", "--percentiles", "-C N", "--check-every", "--memory", "--nonblocking W"):
        assert flag in text
