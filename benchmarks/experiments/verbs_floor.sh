#!/usr/bin/env bash
# What an 8-byte message costs in the rdma-lab VM, layer by layer, in ONE boot (issue 30,
# part 4): pycoll over verbs, over tcp, and over shared memory (no network at all: the cost
# of pycoll's own Python per message on this emulated CPU, the floor of any pycoll
# transport here), against perftest's ib_write_lat (C, busy polling) and a bare Python
# function call (how fast the emulated CPU runs Python). Alternated ROUNDS times. From the host:
#
#   bash tests/verbs/run_in_vm.sh --cmd bash benchmarks/experiments/verbs_floor.sh [ROUNDS]
set -uo pipefail
ROUNDS=${1:-3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
DEV=${RDMA_LAB_DEV:-rxe0}; GIDX=${RDMA_LAB_GID_INDEX:-1}
lat() { PYTHONPATH=$HERE python3 -m pycoll.bench latency -n 2 -m 8:8 -i 300 -x 30 --transport "$1" \
          2>/dev/null | grep -v '^#' | grep -v '^$' | tail -1 | awk '{print $2}'; }
perf() { ib_write_lat -d "$DEV" -x "$GIDX" -s 8 -n 1000 >/dev/null 2>&1 & sleep 1
         ib_write_lat -d "$DEV" -x "$GIDX" -s 8 -n 1000 127.0.0.1 2>&1 | grep -A1 t_min | tail -1 \
           | awk '{print "t_min", $3, "t_typical", $5, "t_avg", $6}'; wait; }
call() { python3 -c 'import timeit; f = lambda: None
print(round(min(timeit.repeat(f, number=20000, repeat=5)) / 20000 * 1e6, 3))'; }
echo "python3 $(python3 -c 'import sys; print(sys.version.split()[0])'), $(nproc) vCPUs, $(uname -r)"
for r in $(seq "$ROUNDS"); do
  echo "round $r: pycoll verbs  $(lat verbs) us"
  echo "round $r: pycoll tcp    $(lat tcp) us"
  echo "round $r: pycoll shm    $(lat shm) us"
  echo "round $r: ib_write_lat  $(perf) us"
  echo "round $r: python call   $(call) us (an empty function, timeit)"
done
