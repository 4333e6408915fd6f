#!/bin/bash
# The runs behind results.md, from the repository root:
#   bash benchmarks/results/2026-11-25-bench-modes/run.sh
set -u
D=benchmarks/results/2026-11-25-bench-modes
PY=${PY:-python}
uptime > $D/load.txt
$PY -m pycoll.bench allreduce -n 2 -m 8:64K -i 1000 -x 100 -P --memory -q \
    --json $D/tails-shm.json > $D/tails-shm.txt
$PY -m pycoll.bench allreduce -n 2 -m 8:64K -i 1000 -x 100 -P --memory -q --transport tcp \
    --json $D/tails-tcp.json > $D/tails-tcp.txt
for w in 1 4; do
  for t in shm tcp; do
    $PY -m pycoll.bench allreduce -n 2 -m 1K:16M -i 50 -x 5 --nonblocking $w -q \
        --transport $t --json $D/overlap-$t-w$w.json > $D/overlap-$t-w$w.txt
  done
done
$PY -m pycoll.bench allreduce -n 2 -m 8:16M -i 50 -x 5 -C 1 -q --json $D/check-every.json \
    > $D/check-every.txt
$PY -m pycoll.bench allreduce -n 2 -m 8:16M -i 50 -x 5 -q --json $D/plain.json > $D/plain.txt
uptime >> $D/load.txt
