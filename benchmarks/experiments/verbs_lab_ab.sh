#!/usr/bin/env bash
# Before and after in ONE boot of the rdma-lab VM: the goal sections of verbs_lab.sh (allreduce
# 8M verbs vs tcp, latency, bw) for a base checkout, the whole lab (perftest included) for this
# one, the base's latency again (to see load drift: TCG under other load swings 2-5x), and the
# 8-byte ping-pong profile (benchmarks/experiments/verbs_profile.py) of both. Run from the host:
#
#   git worktree add /tmp/verbs-before <base commit>
#   RDMA_LAB_SHARES=/tmp/verbs-before bash tests/verbs/run_in_vm.sh --cmd \
#       bash benchmarks/experiments/verbs_lab_ab.sh /tmp/verbs-before
set -uo pipefail
BASE=${1:?usage: verbs_lab_ab.sh BASE_CHECKOUT}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
LAB=$HERE/benchmarks/verbs_lab.sh
echo "##### before ($BASE): sections 1a 1c 1d"
PYTHONPATH=$BASE VERBS_LAB_ONLY="1a 1c 1d" bash "$LAB"
echo; echo "##### after ($HERE): the whole lab"
PYTHONPATH=$HERE bash "$LAB"
echo; echo "##### before again ($BASE): section 1c"
PYTHONPATH=$BASE VERBS_LAB_ONLY="1c" bash "$LAB"
for tree in "$BASE" "$HERE"; do
  echo; echo "##### profile of an 8 B ping-pong ($tree)"
  PYTHONPATH=$tree python3 "$HERE/benchmarks/experiments/verbs_profile.py" 200 2>&1 | grep -v '^\[INFO'
done
echo; echo "##### bare pyverbs SEND ping-pong, no pycoll (tools/rdma-lab/examples/pyverbs_rc_smoke.py)"
python3 "$HERE/tools/rdma-lab/examples/pyverbs_rc_smoke.py" --iters 300 2>&1 | grep "ping-pongs"
