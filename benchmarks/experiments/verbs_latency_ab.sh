#!/usr/bin/env bash
# 8-byte latency, before vs after vs tcp vs ib_write_lat, alternated ROUNDS times in ONE boot
# of the rdma-lab VM (under TCG with other load on the host a single run swings 2-10x;
# alternating and taking each one's best and median is the fair comparison). From the host:
#
#   RDMA_LAB_SHARES=/tmp/verbs-before bash tests/verbs/run_in_vm.sh --cmd \
#       bash benchmarks/experiments/verbs_latency_ab.sh /tmp/verbs-before [ROUNDS]
set -uo pipefail
BASE=${1:?usage: verbs_latency_ab.sh BASE_CHECKOUT [ROUNDS]}
ROUNDS=${2:-3}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
DEV=${RDMA_LAB_DEV:-rxe0}; GIDX=${RDMA_LAB_GID_INDEX:-1}
lat() { PYTHONPATH=$1 python3 -m pycoll.bench latency -n 2 -m 8:8 -i 300 -x 30 --transport "$2" \
          2>/dev/null | grep -v '^#' | grep -v '^$' | tail -1 | awk '{print $2}'; }
perf() { ib_write_lat -d "$DEV" -x "$GIDX" -s 8 -n 1000 >/dev/null 2>&1 & sleep 1
         ib_write_lat -d "$DEV" -x "$GIDX" -s 8 -n 1000 127.0.0.1 2>&1 | grep -A1 t_min | tail -1 \
           | awk '{print "t_min", $3, "t_typical", $5, "t_avg", $6}'; wait; }
for r in $(seq "$ROUNDS"); do
  echo "round $r: verbs before $(lat "$BASE" verbs) us"
  echo "round $r: verbs after  $(lat "$HERE" verbs) us"
  echo "round $r: tcp          $(lat "$HERE" tcp) us"
  echo "round $r: ib_write_lat $(perf) us"
done
