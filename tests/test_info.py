"""``python -m pycoll.info`` and the console scripts: real subprocesses, real probes.

The JSON is read back from a child process, as a user would run it. "Without numba" hides
numba in the child by setting ``sys.modules["numba"] = None`` before pycoll is imported:
Python's documented way to make ``import numba`` fail and ``importlib.util.find_spec``
answer None, i.e. what a host without numba sees (numba stays installed in the venv).
"""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from pycoll.algorithms import ALGORITHMS
from pycoll.info.choices import SIZES
from pycoll.info.variables import BY_NAME

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: a full name: not a prefix such as ``PYCOLL_TLS_*`` or ``PYCOLL_*``
NAME = re.compile(r"PYCOLL_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")


def run_info(*args: str, hide_numba: bool = False, env: dict[str, str] | None = None,
             json_out: bool = True) -> dict | str:
    code = ("import sys\n"
            + ("sys.modules['numba'] = None\n" if hide_numba else "")
            + "from pycoll.info import main\nsys.exit(main(sys.argv[1:]))\n")
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    full_env.update(env or {})
    full_env["PYTHONPATH"] = ROOT + os.pathsep + full_env.get("PYTHONPATH", "")
    argv = [*args, "--json"] if json_out else list(args)
    done = subprocess.run([sys.executable, "-c", code, *argv], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if json_out else done.stdout


def test_module_form_prints_json_with_every_section():
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYCOLL_")}
    full_env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, "-m", "pycoll.info", "--json"], env=full_env,
                          cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    from pycoll._version import __version__
    assert rep["version"] == __version__
    assert set(rep["extras"]) == {"numba", "torch", "cupy", "pyverbs", "mpi4py"}
    each = rep["transports"]["each"]
    assert set(each) == {"cuda_ipc", "shm", "verbs", "tcp", "inproc"}
    assert each["tcp"]["usable"] is True and "lo" in each["tcp"]["details"]["interfaces"]
    assert each["shm"]["usable"] is True and each["shm"]["details"]["free_bytes"] > 0
    for t in each.values():          # every transport not usable says why
        assert t["usable"] or t["reason"], t
    assert "algorithms" not in rep


def test_with_numba_the_fast_path_is_on():
    pytest.importorskip("numba")
    rep = run_info()
    numba = rep["extras"]["numba"]
    assert numba["found"] and numba["imports"] and numba["version"]
    fast = rep["fast_path"]
    assert {k: fast[k] for k in ("on", "limit_bytes", "reason")} == {
        "on": True, "limit_bytes": 262144, "reason": ""}
    # the compiled call path: which one runs, and why not C (test_fastpath_call_path.py
    # requires C where a compiler is)
    assert fast["call_path"] in ("c", "python"), fast
    assert (fast["call_path"] == "c") == (fast["call_path_reason"] == ""), fast


def test_the_python_call_path_is_reported_with_its_reason():
    rep = run_info(env={"PYCOLL_FASTPATH_C": "0"})
    assert rep["fast_path"]["call_path"] == "python"
    assert rep["fast_path"]["call_path_reason"] == "PYCOLL_FASTPATH_C=0"


def test_without_numba_it_is_reported_missing_and_the_fast_path_off():
    rep = run_info(hide_numba=True)
    assert rep["extras"]["numba"] == {"found": False, "version": rep["extras"]["numba"]
                                      ["version"]}
    assert "imports" not in rep["extras"]["numba"]
    assert rep["fast_path"]["on"] is False
    assert "numba is not installed" in rep["fast_path"]["reason"]


def test_fast_path_off_by_variable_says_so():
    rep = run_info(env={"PYCOLL_FASTPATH": "0"})
    assert rep["fast_path"]["on"] is False
    assert "PYCOLL_FASTPATH is off" in rep["fast_path"]["reason"]


def test_environment_values_defaults_secrets_and_typos():
    rep = run_info(env={"PYCOLL_SOCKET_NSOCKS": "4", "PYCOLL_TOKEN": "s3cr3t-value",
                        "PYCOLL_SOKET_NSOCKS": "2"})
    rows = {r["name"]: r for r in rep["environment"]}
    assert rows["PYCOLL_SOCKET_NSOCKS"]["value"] == "4"
    assert rows["PYCOLL_SOCKET_NSOCKS"]["default"] == "1"
    assert rows["PYCOLL_DEBUG"]["value"] is None
    assert rows["PYCOLL_TOKEN"]["value"] == "(set, hidden)"
    assert "s3cr3t-value" not in json.dumps(rep)
    assert rows["PYCOLL_SOKET_NSOCKS"]["section"] == "unknown"
    assert set(BY_NAME) <= set(rows)


def test_transport_allow_list_is_reported_and_a_bad_one_explained():
    rep = run_info(env={"PYCOLL_TRANSPORTS": "tcp"})
    assert rep["transports"]["allowed"] == ["tcp"]
    assert rep["transports"]["each"]["shm"]["allowed"] is False
    bad = run_info(env={"PYCOLL_TRANSPORTS": "tpc"})
    assert bad["transports"]["allowed"] == [] and "tpc" in bad["transports"]["error"]


def test_algorithm_table_two_nodes():
    rep = run_info("--algorithms", "-n", "8", "--nodes", "2")
    alg = rep["algorithms"]
    assert (alg["nodes"], alg["ranks_per_node"]) == (2, 4)
    assert alg["transports"] == {"intra_node": "shm", "inter_node": "tcp"}
    assert alg["sizes"] == SIZES and SIZES[0] == 8 and SIZES[-1] == 256 << 20
    assert set(alg["choices"]) == set(ALGORITHMS)
    assert all(len(row) == len(SIZES) for row in alg["choices"].values())
    # several equal nodes: the two-level model competes (and wins allreduce somewhere)
    assert "hierarchical" in alg["choices"]["allreduce"]
    one = run_info("--algorithms", "-n", "4")["algorithms"]
    assert one["transports"] == {"intra_node": "shm", "inter_node": None}
    assert "hierarchical" not in one["choices"]["allreduce"]


def test_algorithm_table_follows_pycoll_algo_and_rejects_bad_layouts():
    forced = run_info("--algorithms", "-n", "4", env={"PYCOLL_ALGO": "allreduce=ring"})
    assert set(forced["algorithms"]["choices"]["allreduce"]) == {"ring"}
    bad = run_info("--algorithms", "-n", "6", "--ranks-per-node", "4")["algorithms"]
    assert "equal nodes" in bad["error"]


def test_text_form_has_its_sections():
    out = run_info("--algorithms", "-n", "2", json_out=False)
    for heading in ("pycoll ", "Optional packages:", "Transports (allowed:",
                    "Environment (value / default):", "Algorithms for 2 ranks"):
        assert heading in out


def _names_in(paths: list[str]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            found |= set(NAME.findall(f.read()))
    return found


def test_every_variable_in_the_source_and_the_docs_is_in_the_table():
    sources = [os.path.join(d, n) for pkg in ("pycoll", "rendezvous")
               for d, _dirs, names in os.walk(os.path.join(ROOT, pkg))
               for n in names if n.endswith(".py")
               and not d.startswith(os.path.join(ROOT, "pycoll", "info"))]   # the table
    in_code = _names_in(sources)
    in_docs = _names_in([os.path.join(ROOT, "docs", "environment.md")])
    assert len(in_code) > 40 and len(in_docs) > 40     # the scan itself works
    assert not in_code - set(BY_NAME), "add these to pycoll/info/variables.py"
    assert not in_docs - set(BY_NAME), "add these to pycoll/info/variables.py"
    assert not set(BY_NAME) - in_code, "the table names variables no code reads"


def test_console_script_targets_import_and_are_callable():
    tomllib = pytest.importorskip("tomllib")      # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert set(scripts) == {"pycoll-run", "pycoll-bench", "pycoll-info", "pycoll-trace",
                            "pycoll-status", "pycoll-top"}
    for target in scripts.values():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target
