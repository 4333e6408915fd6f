"""benchmarks/performance.py's rendering: docs/performance.md's generated part from compare.py
results folders (tiny hand-made ones here; the measuring part is compare.py's, smoke-tested in
test_compare.py)."""
from __future__ import annotations

import json

import pytest

from .helpers import benchmark_module


def _row(coll, n, lib, size, us):
    busbw = size / us / 1e3 * (2 * (n - 1) / n if coll == "allreduce" else 1)
    return {"collective": coll, "ranks": n, "library": lib, "size": size, "avg_us": us,
            "busbw_GBps": busbw, "validation": "Pass"}


def _folder(path, rows, git, argv):
    path.mkdir()
    (path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "machine.json").write_text(json.dumps({
        "git": git, "date": "2026-11-28T09:35:00", "nproc": 2, "cpu": "Test CPU",
        "memory_GiB": 1.0, "kernel": "6.0", "python": "3.11", "numpy": "2", "torch": "2",
        "argv": argv, "mpi_peers": {"openmpi": {"mpi4py": "4", "library": "Open MPI v5, x"}}}))
    return str(path)


PAGE = ("# Performance\n\nhand-written\n\n{begin}\nold table\n{end}\n\n## Other\n\nkept\n")


def test_rewrites_only_the_generated_part_and_the_newer_run_wins(tmp_path):
    perf = benchmark_module("performance")
    full = _folder(tmp_path / "full", [
        _row("allreduce", 2, "pycoll", 8, 2.0), _row("allreduce", 2, "openmpi", 8, 1.0),
        _row("allreduce", 2, "gloo", 8, 100.0),
        _row("allreduce", 2, "pycoll", 32, 4.0), _row("allreduce", 2, "openmpi", 32, 8.0),
        _row("allreduce", 2, "gloo", 32, 400.0),
        _row("allreduce", 2, "pycoll", 16, 3.0),             # an odd power: not a table row
        _row("broadcast", 4, "pycoll", 8, 1.0), _row("broadcast", 4, "mpich", 8, 3.0),
    ], "aaaa111", ["python", "benchmarks/compare.py", "--label", "full"])
    small = _folder(tmp_path / "small", [
        _row("allreduce", 2, "pycoll", 8, 0.5), _row("allreduce", 2, "openmpi", 8, 1.0),
    ], "bbbb222", ["python", "benchmarks/compare.py", "--label", "small"])
    doc = tmp_path / "performance.md"
    doc.write_text(PAGE.format(begin=perf.BEGIN, end=perf.END))
    assert perf.main(["--from", full, small, "--doc", str(doc), "--no-plots"]) == 0
    text = doc.read_text()
    assert text.startswith("# Performance\n\nhand-written\n\n" + perf.BEGIN + "\n")
    assert text.endswith(perf.END + "\n\n## Other\n\nkept\n")
    assert "old table" not in text
    # the runs, with the commit each was measured at and its command
    assert "| 1 | 2026-11-28T09:35 | aaaa111 |" in text
    assert "| 2 | 2026-11-28T09:35 | bbbb222 |" in text
    assert "`python benchmarks/compare.py --label small`" in text
    assert "2 CPUs (Test CPU)" in text and "Open MPI: mpi4py 4 on Open MPI v5" in text
    lines = text.splitlines()
    # one table per collective; 8 B comes from the second run, with its own ratio
    assert "### allreduce" in lines and "### broadcast" in lines
    assert "| ranks | size | pycoll (µs) | Gloo (µs) | Open MPI (µs) | pycoll/best MPI | "\
        "pycoll/Gloo | run |" in lines
    assert "| 2 | 8B | 0.5 | – | 1 | 2.00x | – | 2 |" in lines
    assert "| 2 | 32B | 4 | 400 | 8 | 2.00x | 100.00x | 1 |" in lines
    assert not any(ln.startswith("| 2 | 16B |") for ln in lines)
    assert "| 4 | 8B | 1 | 3 | 3.00x | 1 |" in lines
    # rendering again gives the same page
    assert perf.main(["--from", full, small, "--doc", str(doc), "--no-plots"]) == 0
    assert doc.read_text() == text


def test_a_page_without_markers_is_an_error(tmp_path):
    perf = benchmark_module("performance")
    with pytest.raises(SystemExit, match="markers"):
        perf.replace_generated("# no markers\n", "x")


def test_the_page_in_the_tree_has_its_markers():
    perf = benchmark_module("performance")
    with open(perf.DOC) as f:
        page = f.read()
    assert page.count(perf.BEGIN) == 1 and page.count(perf.END) == 1
