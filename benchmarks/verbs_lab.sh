#!/usr/bin/env bash
# The verbs transport's measurements, in one boot of the rdma-lab VM (Soft-RoCE under TCG
# emulation: absolute numbers mean little, ratios within one run do). Run from the host:
#
#   bash tests/verbs/run_in_vm.sh --cmd bash benchmarks/verbs_lab.sh
#
# 1. verbs vs tcp: allreduce and broadcast of 8 MiB on 2 ranks; point-to-point latency/bw
# 2. the ceiling: perftest's ib_write_lat / ib_write_bw on the same device
# 3. eager vs rendezvous: latency with everything eager vs everything rendezvous
# 4. 1, 2, 4 data queue pairs per peer: bw of 8 MiB messages
# 5. registration cache hit vs miss: allreduce of 8 MiB with and without the cache
#
# VERBS_LAB_ONLY="1a 1c 1d 2" runs only those sections (e.g. for a second tree in the same
# boot: PYTHONPATH=/path/to/other/checkout VERBS_LAB_ONLY="1a 1c 1d" bash benchmarks/verbs_lab.sh)
set -uo pipefail
B="python3 -m pycoll.bench"
DEV=${RDMA_LAB_DEV:-rxe0}; GIDX=${RDMA_LAB_GID_INDEX:-1}
ONLY=" ${VERBS_LAB_ONLY:-1a 1b 1c 1d 2 3 4 5} "
want() { [[ "$ONLY" == *" $1 "* ]]; }
section() { echo; echo "=== $* ==="; }
last() { grep -v '^#' | grep -v '^$' | tail -n "${1:-1}"; }

if want 1a; then
section "1a. allreduce 8M, 2 ranks (size, count, type, redop, time us, algbw, busbw)"
for t in verbs tcp; do echo "-- $t"; $B allreduce -n 2 -m 8M:8M -i 10 -x 2 --transport $t | last; done
fi
if want 1b; then
section "1b. broadcast 8M, 2 ranks"
for t in verbs tcp; do echo "-- $t"; $B broadcast -n 2 -m 8M:8M -i 10 -x 2 --transport $t | last; done
fi
if want 1c; then
section "1c. latency (us), 2 ranks"
for t in verbs tcp; do echo "-- $t"; $B latency -n 2 -m 8:64K -i 300 -x 30 --transport $t | last 14; done
fi
if want 1d; then
section "1d. bw (MB/s), 2 ranks"
for t in verbs tcp; do echo "-- $t"; $B bw -n 2 -m 64K:4M -i 4 -x 1 --transport $t | last 7; done
fi

if want 2; then
section "2. perftest ceiling on $DEV (ib_write_lat 8 B, ib_write_bw 64 KiB to 8 MiB)"
ib_write_lat -d "$DEV" -x "$GIDX" -s 8 -n 300 >/tmp/lat_srv.txt 2>&1 & sleep 1
ib_write_lat -d "$DEV" -x "$GIDX" -s 8 -n 300 127.0.0.1 2>&1 | grep -A1 "t_min" | tail -2; wait
for s in 65536 1048576 2097152 4194304 8388608; do
  ib_write_bw -d "$DEV" -x "$GIDX" -s $s -n 20 >/tmp/bw_srv.txt 2>&1 & sleep 1
  ib_write_bw -d "$DEV" -x "$GIDX" -s $s -n 20 127.0.0.1 2>&1 | grep -A1 "BW average" | tail -2; wait
done
fi

if want 3; then
section "3. eager vs rendezvous latency (us): PYCOLL_IB_EAGER_MAX=1M (all eager) vs 0 (all rendezvous)"
for e in 1048576 0; do echo "-- PYCOLL_IB_EAGER_MAX=$e"
  PYCOLL_IB_EAGER_MAX=$e PYCOLL_IB_QPS_PER_PEER=1 $B latency -n 2 -m 1K:256K -i 100 -x 10 --transport verbs | last 9; done
fi

if want 4; then
section "4. data queue pairs per peer: bw (MB/s) of 8M messages"
for q in 1 2 4; do echo "-- PYCOLL_IB_QPS_PER_PEER=$q"
  PYCOLL_IB_QPS_PER_PEER=$q $B bw -n 2 -m 8M:8M -i 3 -x 1 --transport verbs | last 1; done
fi

if want 5; then
section "5. registration cache: allreduce 8M with the cache vs without (PYCOLL_IB_REG_CACHE_ENTRIES=0)"
for c in 1024 0; do echo "-- PYCOLL_IB_REG_CACHE_ENTRIES=$c"
  PYCOLL_IB_REG_CACHE_ENTRIES=$c $B allreduce -n 2 -m 8M:8M -i 10 -x 2 --transport verbs | last; done
fi
