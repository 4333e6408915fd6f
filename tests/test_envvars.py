"""PYCOLL_* variables: a bad value raises pycoll.InvalidArgument naming the variable, when the
value is used (communicator setup, a benchmark's flags), never at ``import pycoll``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pycoll
from pycoll import debug
from pycoll.algorithms import selection as tuning
from pycoll.bench import options as bench_options
from pycoll.runtime import abort, flight_recorder
from pycoll.testing import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh_python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter with ``env`` added; its stdout (it must exit 0)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env=dict(os.environ, **env))
    assert out.returncode == 0, out.stderr
    return out.stdout


def _raises_naming(var: str, fn, *args):
    with pytest.raises(pycoll.InvalidArgument) as e:
        fn(*args)
    assert var in str(e.value), str(e.value)
    return e.value


# -- PYCOLL_ABORT_POLL_MS -------------------------------------------------------------------

@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf", "1e999"])
def test_abort_poll_ms_bad_value(monkeypatch, value):
    monkeypatch.setenv("PYCOLL_ABORT_POLL_MS", value)
    _raises_naming("PYCOLL_ABORT_POLL_MS", abort.poll_interval)


def test_abort_poll_ms_good_values(monkeypatch):
    monkeypatch.delenv("PYCOLL_ABORT_POLL_MS", raising=False)
    assert abort.poll_interval() == pytest.approx(0.1)          # default 100 ms
    monkeypatch.setenv("PYCOLL_ABORT_POLL_MS", "")
    assert abort.poll_interval() == pytest.approx(0.1)
    monkeypatch.setenv("PYCOLL_ABORT_POLL_MS", " 250 ")
    assert abort.poll_interval() == pytest.approx(0.25)
    monkeypatch.setenv("PYCOLL_ABORT_POLL_MS", "0.5")
    assert abort.poll_interval() == pytest.approx(0.0005)


def test_abort_poll_ms_is_read_at_use_not_at_import():
    code = (
        "import pycoll\n"
        "from pycoll.runtime.abort import AbortWatch\n"
        "print('imported')\n"
        "try:\n"
        "    AbortWatch(None, 'w', 0)\n"
        "except pycoll.InvalidArgument as e:\n"
        "    print('InvalidArgument:', e)\n"
    )
    out = _fresh_python(code, PYCOLL_ABORT_POLL_MS="abc")
    lines = out.splitlines()
    assert lines[0] == "imported", out
    assert lines[1].startswith("InvalidArgument: PYCOLL_ABORT_POLL_MS='abc'"), out


def _init_only(comm):
    return comm.rank


@pytest.mark.parametrize("var,value", [
    ("PYCOLL_ABORT_POLL_MS", "abc"),
    ("PYCOLL_FLIGHT_RECORDER", "lots"),
    ("PYCOLL_DEBUG", "verbose"),
])
def test_bad_value_fails_communicator_setup_naming_the_variable(var, value):
    outcomes = run_ranks(_init_only, 2, env={var: value}, timeout=60, expect_failure=True)
    for rank, (kind, tb) in enumerate(outcomes):
        assert kind == "InvalidArgument", (rank, kind, tb)
        assert f"{var}={value!r}" in tb, tb


def test_fastpath_c_bad_value_does_not_break_import_and_raises_at_init():
    """PYCOLL_FASTPATH_C is read at import (it picks the classes the calls go through): a
    typo turns the compiled path off there and raises when a communicator is made."""
    code = (
        "import pycoll\n"
        "from pycoll import fastpath\n"
        "from pycoll.fastpath.compiled import callpath, unavailable\n"
        "print('imported', callpath.COMPILED, unavailable)\n"
        "try:\n"
        "    fastpath.probe_record()\n"
        "except pycoll.InvalidArgument as e:\n"
        "    print('InvalidArgument:', e)\n"
    )
    out = _fresh_python(code, PYCOLL_FASTPATH_C="maybe")
    assert "imported False PYCOLL_FASTPATH_C='maybe'" in out, out
    assert "InvalidArgument: PYCOLL_FASTPATH_C='maybe'" in out, out


# -- PYCOLL_FLIGHT_RECORDER -----------------------------------------------------------------

@pytest.mark.parametrize("value", ["lots", "1.5", "-1"])
def test_flight_recorder_bad_value(monkeypatch, value):
    monkeypatch.setenv("PYCOLL_FLIGHT_RECORDER", value)
    _raises_naming("PYCOLL_FLIGHT_RECORDER", flight_recorder.capacity_from_env)


def test_flight_recorder_good_values(monkeypatch):
    monkeypatch.delenv("PYCOLL_FLIGHT_RECORDER", raising=False)
    assert flight_recorder.capacity_from_env() == flight_recorder.DEFAULT_CAPACITY
    monkeypatch.setenv("PYCOLL_FLIGHT_RECORDER", "0")
    assert flight_recorder.capacity_from_env() == 0
    monkeypatch.setenv("PYCOLL_FLIGHT_RECORDER", "64")
    assert flight_recorder.capacity_from_env() == 64


# -- PYCOLL_DEBUG ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["verbose", "1", "TRACE"])
def test_debug_bad_value(monkeypatch, value):
    monkeypatch.setenv("PYCOLL_DEBUG", value)
    _raises_naming("PYCOLL_DEBUG", debug.level)
    _raises_naming("PYCOLL_DEBUG", debug.detail_enabled)


@pytest.mark.parametrize("value,level,detail", [
    (None, "", False), ("", "", False), ("off", "OFF", False), ("warn", "WARN", False),
    ("WARNING", "WARNING", False), ("info", "INFO", False), ("Detail", "DETAIL", True),
    ("DEBUG", "DEBUG", False),
])
def test_debug_good_values(monkeypatch, value, level, detail):
    if value is None:
        monkeypatch.delenv("PYCOLL_DEBUG", raising=False)
    else:
        monkeypatch.setenv("PYCOLL_DEBUG", value)
    assert debug.level() == level
    assert debug.detail_enabled() is detail


# -- PYCOLL_ALGO ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["ring", "allreduce=nope", "nosuchcollective=ring"])
def test_algo_bad_value(monkeypatch, value):
    monkeypatch.setenv("PYCOLL_ALGO", value)
    registry = {"allreduce": {"ring": None, "recursive_doubling": None}}
    _raises_naming("PYCOLL_ALGO", tuning.Selector, registry, [])


def test_algo_good_value(monkeypatch):
    monkeypatch.setenv("PYCOLL_ALGO", " allreduce = ring ")
    registry = {"allreduce": {"ring": None, "recursive_doubling": None}}
    assert tuning.Selector(registry, []).choose("allreduce", 8, 2) == "ring"


# -- PYCOLL_SHM_PREFIX ----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["a/b", "-x", "../x", "x" * 65, "a b"])
def test_shm_prefix_bad_value(monkeypatch, value):
    from pycoll.transports.shm.segment import name_prefix, sweep
    monkeypatch.setenv("PYCOLL_SHM_PREFIX", value)
    _raises_naming("PYCOLL_SHM_PREFIX", name_prefix)
    assert sweep() == []          # the launcher's cleanup: nothing of that name can exist


def test_shm_prefix_names_the_segments(monkeypatch):
    from pycoll.transports.shm.segment import segment_prefix
    monkeypatch.setenv("PYCOLL_SHM_PREFIX", "job-7.a_b")
    assert segment_prefix(42).startswith("job-7.a_b-42-n")
    monkeypatch.setenv("PYCOLL_SHM_PREFIX", "")
    assert segment_prefix(42).startswith("pycoll-42-n")


# -- PYCOLL_BENCH_CORRUPT_RANK --------------------------------------------------------------

@pytest.mark.parametrize("value", ["one", "-1", "1.0"])
def test_bench_corrupt_rank_bad_value(monkeypatch, value):
    monkeypatch.setenv("PYCOLL_BENCH_CORRUPT_RANK", value)
    _raises_naming("PYCOLL_BENCH_CORRUPT_RANK", bench_options.corrupt_rank_from_env)


def test_bench_corrupt_rank_bad_value_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("PYCOLL_BENCH_CORRUPT_RANK", "one")
    with pytest.raises(SystemExit) as e:
        bench_options.parse_args(["allreduce"])
    assert e.value.code == 2
    assert "PYCOLL_BENCH_CORRUPT_RANK='one'" in capsys.readouterr().err


def test_bench_corrupt_rank_good_values(monkeypatch):
    monkeypatch.delenv("PYCOLL_BENCH_CORRUPT_RANK", raising=False)
    assert bench_options.parse_args(["allreduce"]).corrupt_rank is None
    monkeypatch.setenv("PYCOLL_BENCH_CORRUPT_RANK", "")
    assert bench_options.parse_args(["allreduce"]).corrupt_rank is None
    monkeypatch.setenv("PYCOLL_BENCH_CORRUPT_RANK", "1")
    assert bench_options.parse_args(["allreduce"]).corrupt_rank == 1
    assert bench_options.parse_args(["allreduce", "--corrupt-rank", "0"]).corrupt_rank == 0


# -- launch variables -----------------------------------------------------------------------

def test_launch_variables_raise_invalid_argument():
    from pycoll.launch import detect_launch

    err = _raises_naming("PYCOLL_WORLD_SIZE", detect_launch,
                         {"PYCOLL_RANK": "0", "PYCOLL_WORLD_SIZE": "two"})
    assert isinstance(err, ValueError)      # still a ValueError, as before
    _raises_naming("PYCOLL_STORE_EXTERNAL", detect_launch, {"PYCOLL_STORE_EXTERNAL": "maybe"})
