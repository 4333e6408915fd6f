"""Buffer layouts, busbw factors and validation data, checked against a numpy simulation."""
import numpy as np
import pytest

from pycoll.bench import collectives as C

pytestmark = pytest.mark.timeout(60)


def test_busbw_factors_nccl_tests():
    assert C.busbw_factor("allreduce", 2) == 1.0
    assert C.busbw_factor("allreduce", 4) == 1.5
    assert C.busbw_factor("allgather", 4) == 0.75
    for c in ("reduce_scatter", "alltoall", "gather", "scatter"):
        assert C.busbw_factor(c, 8) == 7 / 8
    for c in ("broadcast", "reduce", "latency", "bw"):
        assert C.busbw_factor(c, 8) == 1.0
    assert C.busbw_factor("allreduce", 1) == 0.0


def test_layout_sizes():
    lay = C.layout("allreduce", 1 << 20, "float32", 4)
    assert (lay.count, lay.nbytes, lay.buffers) == (1 << 18, 1 << 20, {"buf": 1 << 18})
    lay = C.layout("allgather", 1 << 20, "float32", 4)
    assert (lay.chunk, lay.count, lay.nbytes) == (1 << 16, 1 << 18, 1 << 20)
    assert lay.buffers == {"out": 1 << 18, "inp": 1 << 16}
    # rounded up to one element per rank
    lay = C.layout("reduce_scatter", 4, "float32", 4)
    assert (lay.chunk, lay.nbytes) == (1, 16)
    assert C.layout("allreduce", 1, "float32", 2).nbytes == 4
    assert C.layout("barrier", 123, "float32", 2).nbytes == 0


def _simulate(coll, ins, n, root, op):
    """What a correct library leaves in each rank's buffers."""
    red = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
           "max": np.maximum}[op]

    def reduce_all(arrs):
        acc = arrs[0].copy()
        for a in arrs[1:]:
            red(acc, a, out=acc)
        if op == "avg":
            acc = (acc / n).astype(acc.dtype) if acc.dtype.kind == "f" else acc // n
        return acc

    outs = [dict(d) for d in ins]
    if coll in ("allreduce", "reduce"):
        r = reduce_all([d["buf"] for d in ins])
        for i in range(n):
            if coll == "allreduce" or i == root:
                outs[i]["buf"] = r
    elif coll == "broadcast":
        for i in range(n):
            outs[i]["buf"] = ins[root]["buf"].copy()
    elif coll in ("allgather", "gather"):
        g = np.concatenate([d["inp"] for d in ins])
        for i in range(n):
            if coll == "allgather" or i == root:
                outs[i]["out"] = g
    elif coll == "reduce_scatter":
        r = reduce_all([d["inp"] for d in ins])
        for i in range(n):
            outs[i]["out"] = np.array_split(r, n)[i]
    elif coll == "alltoall":
        for i in range(n):
            outs[i]["out"] = np.concatenate([np.array_split(ins[j]["inp"], n)[i]
                                             for j in range(n)])
    elif coll == "scatter":
        for i in range(n):
            outs[i]["out"] = np.array_split(ins[root]["inp"], n)[i]
    return outs


COLLS = ["allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
         "gather", "scatter"]


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "int8", "float16", "uint8", "int64"])
def test_validation_passes_for_correct_result_and_catches_corruption(coll, n, dtype):
    ops = ["sum", "prod", "min", "max", "avg"] if C.SPECS[coll].reduction else ["sum"]
    for op in ops:
        for size in (1, 40, 4096):
            lay = C.layout(coll, size, dtype, n)
            root = n - 1
            ins = [C.validation_inputs(coll, lay, r, n, root, dtype, op) for r in range(n)]
            outs = _simulate(coll, ins, n, root, op)
            checked = 0
            for r in range(n):
                exp = C.validation_expected(coll, lay, r, n, root, dtype, op)
                if exp is None:
                    continue
                name, expected = exp
                assert C.count_wrong(outs[r][name], expected, op) == 0, (coll, n, dtype, op, r)
                assert C.count_wrong(C.corrupt(outs[r][name]), expected, op) >= 1
                checked += 1
            assert checked >= 1


def test_stale_output_is_caught():
    # a library that does nothing must fail validation (outputs start at zero)
    n, lay = 3, C.layout("allgather", 48, "float32", 3)
    ins = [C.validation_inputs("allgather", lay, r, n, 0, "float32", "sum") for r in range(n)]
    name, expected = C.validation_expected("allgather", lay, 1, n, 0, "float32", "sum")
    assert C.count_wrong(ins[1][name], expected) > 0


def test_misplaced_alltoall_block_is_caught():
    n, lay = 3, C.layout("alltoall", 3 * 3 * 4 * 5, "int32", 3)
    ins = [C.validation_inputs("alltoall", lay, r, n, 0, "int32", "sum") for r in range(n)]
    # wrong: rank i receives block i from every rank but in reversed source order
    out1 = np.concatenate([np.array_split(ins[j]["inp"], n)[1] for j in reversed(range(n))])
    name, expected = C.validation_expected("alltoall", lay, 1, n, 0, "int32", "sum")
    assert C.count_wrong(out1, expected) > 0


def test_large_pattern_is_cheap():
    p = C.pattern(3, 1 << 24, "float32")
    assert p.dtype == np.float32 and p.size == 1 << 24 and p.min() >= 1 and p.max() <= 5
