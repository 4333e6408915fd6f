"""``pycoll.ReduceOp.SUM``-style constants and ``ReduceOp.premul_sum(factor)``."""
from __future__ import annotations

import numpy as np
import pytest

import pycoll
from pycoll.buffers.reduction import OP_NAMES, ReduceOp, parse_op
from pycoll.testing import run_ranks

CONSTANTS = {"SUM": "sum", "AVG": "avg", "PROD": "prod", "MIN": "min", "MAX": "max",
             "BAND": "band", "BOR": "bor", "BXOR": "bxor"}


@pytest.mark.parametrize("attr,name", sorted(CONSTANTS.items()))
def test_constants_equal_named_ops_and_parse(attr, name):
    op = getattr(pycoll.ReduceOp, attr)
    assert isinstance(op, ReduceOp)
    assert op == ReduceOp(name)
    assert op.factor is None
    assert parse_op(op) == ReduceOp(name) == parse_op(name) == parse_op(name.upper())
    assert str(op) == name


def test_constants_cover_every_op_but_premul_sum():
    assert sorted(CONSTANTS.values()) == sorted(n for n in OP_NAMES if n != "premul_sum")


def test_constants_are_class_attributes_not_fields():
    import dataclasses

    assert [f.name for f in dataclasses.fields(ReduceOp)] == ["name", "factor"]
    assert ReduceOp("max") == ReduceOp.MAX and hash(ReduceOp("max")) == hash(ReduceOp.MAX)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReduceOp.SUM.name = "max"  # type: ignore[misc]


def test_premul_sum_factory():
    op = ReduceOp.premul_sum(0.5)
    assert op == ReduceOp("premul_sum", 0.5)
    assert parse_op(op) is op
    assert str(op) == "premul_sum(0.5)"
    assert ReduceOp.premul_sum(2).factor == 2.0
    assert ReduceOp.premul_sum(np.float32(0.25)).factor == 0.25
    for bad in (True, "2", None, [2]):
        with pytest.raises(pycoll.InvalidArgument, match="factor"):
            ReduceOp.premul_sum(bad)  # type: ignore[arg-type]
    with pytest.raises(pycoll.InvalidArgument, match="premul_sum"):
        parse_op(ReduceOp("premul_sum"))


def _allreduce_with_constants(comm):
    a = np.array([comm.rank * 10 + 1, 7 - comm.rank, 3], dtype=np.int32)
    comm.allreduce(a, op=pycoll.ReduceOp.MAX)
    b = np.array([1.0, 2.0, 4.0], dtype=np.float32) * (comm.rank + 1)
    comm.allreduce(b, op=pycoll.ReduceOp.premul_sum(0.5))
    c = np.array([0b0011, 0b0101], dtype=np.uint8) << comm.rank
    comm.allreduce(c, op=pycoll.ReduceOp.BOR)
    return a.tolist(), b.tolist(), c.tolist()


def test_allreduce_with_reduceop_constants():
    results = run_ranks(_allreduce_with_constants, 2)
    for a, b, c in results:
        assert a == [11, 7, 3]                       # MAX of [1, 7, 3] and [11, 6, 3]
        assert b == [1.5, 3.0, 6.0]                  # 0.5 * (x + 2x)
        assert c == [0b0011 | 0b0110, 0b0101 | 0b1010]



HALF_PRECISION_WITHOUT_IMPORTING_TORCH = """
import sys
import numpy as np
from pycoll.buffers.reduction import ReduceOp, combiner, reducer
a, b = np.full(5, 1.5, np.float16), np.full(5, 0.25, np.float16)
reducer(ReduceOp("sum"), "float16")(a, b)
assert (a == 1.75).all(), a
bits = np.full(5, 0x3FC0, np.uint16)              # bfloat16 1.5
reducer(ReduceOp("max"), "bfloat16")(bits, np.full(5, 0x4000, np.uint16))     # 2.0
assert (bits == 0x4000).all(), bits
assert combiner(ReduceOp("sum"), "float16") is None
assert "torch" not in sys.modules, "the reduction imported torch"
try:
    import torch
except ImportError:
    print("OK no torch")
    raise SystemExit
assert reducer(ReduceOp("sum"), "float16").__name__ == "reduce_half_torch"
print("OK torch")
"""


def test_half_precision_reduction_never_imports_torch():
    """The first half-precision reduction of a numpy program ran ``import torch`` inside the
    collective: seconds (tens of them on a crowded machine) while its peers waited under the
    deadline; a simulated GPU allreduce timed out on it. torch's kernels serve programs that
    imported torch; the others get numpy's."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", HALF_PRECISION_WITHOUT_IMPORTING_TORCH],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("OK"), out.stdout + out.stderr
