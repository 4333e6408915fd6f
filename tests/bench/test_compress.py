"""``python -m pycoll.bench <collective> --compress FMT``: the timings run compressed (busbw on
the uncompressed size) and a table reports wire bytes and the measured error, within the
bound of docs/numerics.md on every measured size; flags that cannot apply exit with usage."""
from __future__ import annotations

import json

import pytest

from .helpers import bench

pytestmark = pytest.mark.timeout(300)


def _table(text: str) -> list[list[str]]:
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("# compress="):
            inside = True
            continue
        if inside and line.startswith("#") and line[1:].split()[:1] != ["Size"]:
            fields = line[1:].split()
            if fields and fields[0].isdigit():
                rows.append(fields)
    return rows


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather",
                                        "broadcast"])
def test_reports_wire_bytes_and_the_error_within_its_bound(collective):
    r = bench(collective, "--compress", "int8", "-n", "2", "-m", "1K:64K", "-i", "2", "-x",
              "1", "-q", timeout=240)
    assert r.returncode == 0, r.stderr
    assert "compressed (compress=int8)" in r.stdout
    rows = _table(r.stdout)
    assert len(rows) == 7, r.stdout
    for size, dtype, wire, ratio, err, over, model in rows:
        assert dtype == "float32"
        assert model == "no", (size, model)     # one host, small sizes: the model says so
        assert int(wire) == int(size) // 4 + 4 * -(-int(size) // 4 // 256) or \
            collective in ("allgather", "reduce_scatter"), (size, wire)
        assert float(ratio) < 0.27
        assert 0 < float(err) and float(over) <= 1.0, (size, err, over)


def test_jsonl_rows_carry_the_measurement(tmp_path):
    out = tmp_path / "run.json"
    r = bench("allreduce", "--compress", "bf16", "-n", "2", "-m", "4K:8K", "-i", "2", "-x",
              "1", "-q", "--json", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    rows = data["results"] if isinstance(data, dict) else data
    assert all(row["compress"] == "bf16" and row["wire_bytes"] == row["size"] // 2
               and row["err_over_bound"] <= 1.0 and row["model_pays"] is False
               for row in rows), rows


@pytest.mark.parametrize("args", [["barrier", "--compress", "fp8"],
                                  ["allreduce", "--compress", "fp8", "-c"],
                                  ["allreduce", "--compress", "fp8", "-T", "int32"],
                                  ["allreduce", "--compress", "fp4"]])
def test_flags_that_cannot_apply_exit_with_usage(args):
    r = bench(*args)
    assert r.returncode == 2 and "usage" in r.stderr.lower(), r.stderr
