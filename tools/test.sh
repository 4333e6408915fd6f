#!/usr/bin/env bash
# The project's test command: README.md's line ending in "# run the tests" runs it, and CI
# (.ci/run) runs that line. Steps, in this order:
#
#   install  .venv (python3): torch 2.13.0 (CPU) and the extras test, lint, mpi, bench, spark,
#            ray; a Java runtime for Spark where none is found (apt)
#   lint     ruff over pycoll, rendezvous, tests, benchmarks and tools; mypy (pyproject.toml)
#   test     the whole suite in .venv, then the verbs tests in the Soft-RoCE VM
#   matrix   a quick subset (QUICK below) on other Pythons and numpy releases, each in its own
#            venv under .venv-matrix/ (packages from the index, no torch: off Python 3.11 the
#            index has only multi-GB CUDA builds of it), and the 3.11 "noextras" leg: pycoll's
#            own dependencies and pytest only, where the whole suite must collect and the
#            optional features' tests skip
#
#   bash tools/test.sh                       # every step
#   bash tools/test.sh lint matrix           # some steps
#   MATRIX="py3.12 noextras" bash tools/test.sh matrix   # some matrix legs
#
# The matrix's legs on other Pythons run side by side; their logs follow when all of them
# have ended.
#
# Every step runs even when an earlier one failed (a lint finding does not hide a failing
# test); the summary lists each step's time and result, and the exit status is 1 if any
# step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

# The matrix's quick subset: importing pycoll and what it reports it can use (numba, the
# compiled call path on this numpy), launching, and the core collectives on shm and tcp.
QUICK=(
    tests/test_info.py::test_module_form_prints_json_with_every_section
    tests/test_info.py::test_with_numba_the_fast_path_is_on
    tests/test_info.py::test_console_script_targets_import_and_are_callable
    tests/core/test_init.py::test_pycoll_run_launcher
    tests/core/test_init.py::test_explicit_arguments_and_tcp
    tests/core/test_allreduce.py
    tests/core/test_p2p.py
    tests/core/test_groups.py
    tests/test_reduceop.py
)
# The noextras leg adds the tests of optional features (they must skip, not fail) to QUICK,
# after collecting the whole suite.
OPTIONAL=(
    tests/torch_backend tests/spark tests/ray_actors tests/elastic/test_elastic_ddp_example.py
    tests/bench/test_cli.py::test_plot_under_pycoll_run
    tests/bench/test_cli.py::test_under_torchrun
    tests/bench/test_cli.py::test_under_mpiexec
    "tests/algorithms/test_deterministic.py::test_float32_accumulation_of_halves_rounds_correctly"
)
# name, Python, what to install besides pycoll and the test runner
LEGS=(
    "py3.10 3.10 numpy==1.26.*"
    "py3.12 3.12 numpy>=2"
    "py3.13 3.13 numpy>=2"
    "noextras 3.11 -"
)

RESULTS=()
FAILED=0

run_step() {    # run_step NAME COMMAND...: run, time and record one step
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name ($(date -u +%H:%M:%S) UTC)"
    "$@"
    rc=$?
    RESULTS+=("$(printf '%-18s %5ds  %s' "$name" $((SECONDS - start)) \
        "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")")")
    [ $rc = 0 ] || FAILED=1
    return 0
}

install() {
    python3 -m venv .venv &&
    .venv/bin/pip install -q torch==2.13.0 -e '.[test,lint,mpi,bench,spark,ray]' &&
    { command -v java >/dev/null || { apt-get update -q && apt-get install -y -q \
        --no-install-recommends openjdk-17-jre-headless; }; }
}

lint() {
    local rc=0
    .venv/bin/ruff check pycoll rendezvous tests benchmarks tools || rc=1
    .venv/bin/mypy || rc=1
    return $rc
}

# Two test files at a time (pytest-xdist, a whole file per worker, so that a file's fixtures
# and order stay as written): most tests are several processes that spend their time starting,
# waiting for a deadline or for a peer, and one file's waits overlap the other's work.
# PYCOLL_TEST_WORKERS=1 runs them one at a time.
suite() { .venv/bin/python -m pytest -q -n "${PYCOLL_TEST_WORKERS:-2}" --dist loadfile; }

verbs() { bash tests/verbs/run_in_vm.sh; }

find_python() {  # find_python 3.12: that interpreter, from pyenv or PATH (one that runs)
    local candidate
    for candidate in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".*/bin/python \
                          2>/dev/null | sort -rV) "python$1"; do
        if "$candidate" -c '' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

leg() {          # leg NAME PYTHON-VERSION PACKAGES
    local name=$1 version=$2 packages=$3 python venv=.venv-matrix/$1
    python=$(find_python "$version") || { echo "matrix $name: no python$version" >&2; return 1; }
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" || return 1
    local extra=()
    [ "$packages" = - ] || extra=("$packages")
    "$venv/bin/pip" install -q "${extra[@]}" pytest pytest-timeout -e . || return 1
    "$venv/bin/python" -c 'import sys, numpy, numba; print("matrix:", sys.version.split()[0],
        "numpy", numpy.__version__, "numba", numba.__version__)' || return 1
    if [ "$name" = noextras ]; then
        "$venv/bin/python" -m pytest -q -p no:cacheprovider --collect-only >/dev/null || {
            "$venv/bin/python" -m pytest -q -p no:cacheprovider --collect-only | tail -30
            return 1; }
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "${QUICK[@]}" "${OPTIONAL[@]}"
    else
        "$venv/bin/python" -m pytest -q -p no:cacheprovider "${QUICK[@]}"
    fi
}

side_by_side() {  # side_by_side "NAME|COMMAND..."...: run_step each at once, logs in order
    local dir spec name cmd i=0 n line
    dir=$(mktemp -d)
    for spec in "$@"; do
        IFS='|' read -r name cmd <<<"$spec"
        read -ra cmd <<<"$cmd"      # words (a function and its arguments), never globs
        ( RESULTS=(); run_step "$name" "${cmd[@]}"
          printf '%s\n' "${RESULTS[@]}" >"$dir/$i.result" ) >"$dir/$i.log" 2>&1 &
        i=$((i + 1))
    done
    echo "== side by side: $(printf '%s; ' "${@%%|*}")the logs follow when all have ended"
    wait
    for ((n = 0; n < i; n++)); do
        cat "$dir/$n.log"
        while IFS= read -r line; do
            RESULTS+=("$line")
            [[ $line == *FAILED* ]] && FAILED=1
        done <"$dir/$n.result"
    done
    rm -rf "$dir"
}

# The matrix legs on other Pythons go side by side: each is mostly its own install (a venv,
# pip, a compile) and a few tests, and writes only its own venv (another Python's compiled
# modules have other file names). The noextras leg (Python 3.11, whose compiled modules in
# the tree are .venv's too) runs after them, alone. The verbs VM runs alone: beside three
# legs and two busy loops one of its tests ran past its 300 s limit.
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(install lint test matrix)
for step in "${steps[@]}"; do
    case $step in
        install) run_step install install ;;
        lint) run_step lint lint ;;
        test) run_step tests suite; run_step "verbs (VM)" verbs ;;
        matrix) early=(); late=()
                for spec in "${LEGS[@]}"; do
                    read -r name version packages <<<"$spec"
                    if [ -n "${MATRIX:-}" ] && [[ " $MATRIX " != *" $name "* ]]; then
                        continue
                    fi
                    spec="matrix $name|leg $name $version $packages"
                    if [ "$name" = noextras ]; then late+=("$spec"); else early+=("$spec"); fi
                done
                [ ${#early[@]} -eq 0 ] || side_by_side "${early[@]}"
                [ ${#late[@]} -eq 0 ] || side_by_side "${late[@]}" ;;
        *) echo "tools/test.sh: unknown step '$step' (install, lint, test, matrix)" >&2
           exit 2 ;;
    esac
done
echo "== summary"
printf '%s\n' "${RESULTS[@]}"
exit $FAILED
