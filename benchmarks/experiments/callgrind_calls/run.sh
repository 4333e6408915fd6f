#!/bin/bash
# run.sh TREE LABEL: one 2-rank job of cg_loop.py from the checkout TREE (its extensions
# built in place), rank 0 under callgrind; the profile goes to $OUT/LABEL.out.
# PYTHON: the interpreter (default python); OUT: where the files go (default .).
here=$(cd "$(dirname "$0")" && pwd)
tree=$1; label=$2; out=$(cd "${OUT:-.}" && pwd); tag=$out/$label
python=${PYTHON:-python}
rm -f "$tag".*
(cd "$tree" && PYTHONHASHSEED=0 CG_OUT=$tag PYTHONPATH=$tree timeout 1500 "$python" -m pycoll.run \
    -n 2 --timeout 1400 "$here/cg_loop.py" > "$tag.log" 2>&1) &
job=$!
# instrumentation from here on: the imports and numba's cache load run uninstrumented
while [ ! -f "$tag.ready" ] && kill -0 $job 2>/dev/null; do sleep 1; done
callgrind_control -i on "$(cat "$tag.ready")" >> "$tag.log" 2>&1
touch "$tag.go"
wait $job
echo "$label rc=$?" >> "$tag.log"
