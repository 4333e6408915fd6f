#!/usr/bin/env bash
# Run the verbs transport's tests on a real RDMA device: boot the rdma-lab VM (Soft-RoCE,
# rxe0) once and run every verbs test inside it (tests/verbs and the verbs variants of the
# transport conformance suite). The image is built on first use (~1-2 min, needs root and
# Debian's apt) and kept in $RDMA_LAB_CACHE (default ~/.cache/pycoll-rdma-lab), so later runs
# on the same machine only boot (~10 s). Inside the VM, Debian's python3 runs the project from
# this checkout (PYTHONPATH) with Debian's pyverbs, numpy, pytest and pytest-timeout.
#
#   bash tests/verbs/run_in_vm.sh                 # every verbs test
#   bash tests/verbs/run_in_vm.sh -k kill_9       # extra pytest arguments
#   bash tests/verbs/run_in_vm.sh --cmd 'python3 -m pycoll.bench ...'   # any command instead
#   bash tests/verbs/run_in_vm.sh --build         # only build the image (tools/test.sh does
#                                                 # it beside the suite)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LAB=$ROOT/tools/rdma-lab
export RDMA_LAB_CACHE=${RDMA_LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pycoll-rdma-lab}
export EXTRA_PKGS="python3-numpy python3-pytest-timeout"
export RDMA_LAB_TIMEOUT=${RDMA_LAB_TIMEOUT:-1500}
bash "$LAB/build.sh"
[ "${1:-}" != --build ] || exit 0
if [ "${1:-}" = --cmd ]; then
    shift
    exec bash "$LAB/run.sh" -C "$ROOT" -- "env PYTHONPATH=$ROOT PYTHONDONTWRITEBYTECODE=1 $*"
fi
exec bash "$LAB/run.sh" -C "$ROOT" -- env PYTHONPATH="$ROOT" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -q -p no:cacheprovider -rs tests/verbs tests/transports/test_conformance.py \
    tests/faults/test_integrity.py -k "verbs" "$@"
