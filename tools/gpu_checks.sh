#!/usr/bin/env bash
# The device checks of the CUDA issue, in one run, on a machine with a CUDA GPU, torch built
# with CUDA and CuPy (the cuda extra). Writes its logs under $OUT (default /tmp/pycoll-gpu).
#
#     bash tools/gpu_checks.sh
set -uo pipefail
OUT=${OUT:-/tmp/pycoll-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || export PYTHONPATH=$PWD
python3 -m pip install -q pytest pytest-timeout >>"$OUT/install.log" 2>&1
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import pycoll.cuda as c; print('pycoll cuda:', c.unavailable_reason() or 'usable')" \
    | tee -a "$OUT/gpu.txt"
# 1. every collective x op x dtype, torch CUDA and CuPy buffers, 2/3/4 ranks on one GPU,
#    over cuda_ipc (direct) and shm/tcp (staged); the transport conformance suite on device
#    memory; the torch backend's CUDA scenario
python3 -m pytest -q -p no:cacheprovider tests/cuda \
    "tests/transports/test_conformance.py" -k "cuda" \
    "tests/torch_backend/test_torch_backend.py::test_cuda_tensors_staged_through_host" \
    2>&1 | tee "$OUT/tests.log"
# 2. bandwidth against the device-to-device copy of the same run
python3 -m pycoll.bench allreduce -d cuda -n 2 -m 1K:1G 2>&1 | tee "$OUT/allreduce.txt"
PYCOLL_TRANSPORTS=shm python3 -m pycoll.bench allreduce -d cuda -n 2 -m 1K:1G 2>&1 \
    | tee "$OUT/allreduce-staged.txt"
python3 -m pycoll.bench broadcast -d cuda -n 2 -m 1K:1G 2>&1 | tee "$OUT/broadcast.txt"
# 3. DDP on CUDA: pycoll against Gloo, same parameters after 20 steps, step times
python3 -m pycoll.run -n 2 benchmarks/ddp_cuda.py --steps 20 2>&1 | tee "$OUT/ddp.txt"
