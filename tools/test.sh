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
# What does not need the machine to itself starts with the suite and runs beside it at the
# lowest priority (nice 19, idle I/O): the linters, the VM image's build, and the installs of
# the legs on other Pythons (a venv, pip, a compile each; a leg writes only its own venv and
# its own Python's compiled modules in the tree, whose file names differ from .venv's). The
# suite's ranks spend much of their time waiting on each other, and that idle CPU is what
# these get; on a busy machine they get almost none and finish after the suite instead,
# without slowing it. Their logs follow the suite's. After the verbs VM (emulated, CPU-bound:
# alone, since beside three legs and two busy loops one of its tests ran past its 300 s
# limit) the legs' tests run side by side, and beside them the noextras leg installs and runs
# (Python 3.11: its install rebuilds the compiled modules that the suite and the VM load).
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
    RESULTS+=("$(printf '%-22s %5ds  %s' "$name" $((SECONDS - start)) \
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

vm_image() { bash tests/verbs/run_in_vm.sh --build; }

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

leg_install() {  # leg_install NAME PYTHON-VERSION PACKAGES: the leg's venv, pycoll in it
    local name=$1 version=$2 packages=$3 python venv=.venv-matrix/$1
    python=$(find_python "$version") || { echo "matrix $name: no python$version" >&2; return 1; }
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" || return 1
    local extra=()
    [ "$packages" = - ] || extra=("$packages")
    "$venv/bin/pip" install -q "${extra[@]}" pytest pytest-timeout -e . || return 1
    # the fast path's kernels, compiled into numba's cache for this Python (the tests'
    # conftest.py loads them before each session; cold, that was 2-3 minutes of the legs)
    "$venv/bin/python" -c 'import sys, numpy, numba; print("matrix:", sys.version.split()[0],
        "numpy", numpy.__version__, "numba", numba.__version__)
from pycoll import fastpath
print(f"matrix: the fast path kernels compiled in {fastpath.warm():.0f} s")'
}

leg_tests() {    # leg_tests NAME: the leg's tests in its venv
    local name=$1 py=.venv-matrix/$1/bin/python
    if [ "$name" = noextras ]; then
        "$py" -m pytest -q -p no:cacheprovider --collect-only >/dev/null || {
            "$py" -m pytest -q -p no:cacheprovider --collect-only | tail -30
            return 1; }
        "$py" -m pytest -q -p no:cacheprovider -rs "${QUICK[@]}" "${OPTIONAL[@]}"
    else
        "$py" -m pytest -q -p no:cacheprovider "${QUICK[@]}"
    fi
}

leg() { leg_install "$@" && leg_tests "$1"; }   # leg NAME PYTHON-VERSION PACKAGES

# Steps in the background: `ahead [--nice] NAME COMMAND...` starts run_step NAME COMMAND with
# its output in a file; `collect NAME...` waits for each, prints its log and records its line.
AHEAD=$(mktemp -d)
trap 'rm -rf "$AHEAD"' EXIT
declare -A AHEAD_PID=()

ahead() {
    local nice=0
    if [ "$1" = --nice ]; then nice=1; shift; fi
    local name=$1 file=$AHEAD/${1// /_}
    shift
    ( if [ $nice = 1 ]; then    # CPU and disk: what the suite leaves idle
          renice -n 19 -p "$BASHPID" >/dev/null
          ionice -c 3 -p "$BASHPID" 2>/dev/null
      fi
      RESULTS=(); run_step "$name" "$@"
      printf '%s\n' "${RESULTS[@]}" >"$file.result" ) >"$file.log" 2>&1 &
    AHEAD_PID[$name]=$!
}

collect() {
    local name file line
    for name in "$@"; do
        file=$AHEAD/${name// /_}
        wait "${AHEAD_PID[$name]}"
        cat "$file.log"
        if [ ! -f "$file.result" ]; then
            RESULTS+=("$(printf '%-22s %6s  %s' "$name" - "FAILED (it ended without a result)")")
            FAILED=1
            continue
        fi
        while IFS= read -r line; do
            RESULTS+=("$line")
            [[ $line == *FAILED* ]] && FAILED=1
        done <"$file.result"
    done
}

side_by_side() {  # side_by_side "NAME|COMMAND..."...: run_step each at once, logs in order
    local spec name cmd names=()
    for spec in "$@"; do
        IFS='|' read -r name cmd <<<"$spec"
        read -ra cmd <<<"$cmd"      # words (a function and its arguments), never globs
        ahead "$name" "${cmd[@]}"
        names+=("$name")
    done
    echo "== side by side: $(printf '%s; ' "${names[@]}")the logs follow when all have ended"
    collect "${names[@]}"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(install lint test matrix)
for step in "${steps[@]}"; do
    case $step in install|lint|test|matrix) ;;
        *) echo "tools/test.sh: unknown step '$step' (install, lint, test, matrix)" >&2
           exit 2 ;;
    esac
done
has() { [[ " ${steps[*]} " == *" $1 "* ]]; }

legs=()                 # the matrix legs chosen
if has matrix; then
    for spec in "${LEGS[@]}"; do
        read -r name version packages <<<"$spec"
        if [ -z "${MATRIX:-}" ] || [[ " $MATRIX " == *" $name "* ]]; then legs+=("$spec"); fi
    done
fi

installed=()            # the legs installed beside the suite
for step in "${steps[@]}"; do
    case $step in
        install) run_step install install ;;
        lint) has test || run_step lint lint ;;      # with the tests: beside them
        test) beside=()
              if has lint; then ahead --nice lint lint; beside+=(lint); fi
              ahead --nice "rdma-lab image" vm_image
              for spec in "${legs[@]}"; do
                  read -r name version packages <<<"$spec"
                  [ "$name" != noextras ] || continue     # it installs after the VM
                  ahead --nice "matrix $name install" leg_install "$name" "$version" "$packages"
                  installed+=("$name")
              done
              echo "== beside the suite, at nice 19: $(printf '%s; ' "${beside[@]}" \
                  "rdma-lab image" "${installed[@]/#/matrix install }")their logs follow"
              run_step tests suite
              collect "${beside[@]}" "rdma-lab image"
              run_step "verbs (VM)" verbs ;;
        matrix) specs=()
                for spec in "${legs[@]}"; do
                    read -r name version packages <<<"$spec"
                    if [[ " ${installed[*]} " == *" $name "* ]]; then
                        collect "matrix $name install"
                        [[ ${RESULTS[-1]} == *FAILED* ]] || specs+=("matrix $name|leg_tests $name")
                    else
                        specs+=("matrix $name|leg $name $version $packages")
                    fi
                done
                [ ${#specs[@]} -eq 0 ] || side_by_side "${specs[@]}" ;;
    esac
done
echo "== summary"
printf '%s\n' "${RESULTS[@]}"
exit $FAILED
