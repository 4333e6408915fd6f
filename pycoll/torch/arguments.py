"""torch.distributed's call arguments in pycoll's terms: reduce ops, timeouts, tensor lists.

These run on every torch call, so the common cases come first and are answered with as few
steps as possible (docs/torch.md, Performance).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from ..buffers.reduction import ReduceOp as PycollReduceOp
from ..errors import InvalidArgument
from .work import _seconds

_R = dist.ReduceOp
_RedOpType = _R.RedOpType
_OPS = {
    _R.SUM: "sum", _R.AVG: "avg", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max",
    _R.BAND: "band", _R.BOR: "bor", _R.BXOR: "bxor",
}

#: looked up by the enum's integer value, which pybind reads faster than it hashes the enum
_OPS_BY_VALUE = {kind.value: name for kind, name in _OPS.items()}

_SUM = _R.SUM

#: whether torch gives a backend written in Python PREMUL_SUM's factor (``ReduceOp.factor``,
#: which torch 2.11 and older lack: the factor stays in C++, where only NCCL reads it)
PREMUL_FACTOR_READABLE = hasattr(_R, "factor")


def reduce_op(op: Any) -> Any:
    """torch ReduceOp (or RedOpType) -> pycoll op name / ReduceOp("premul_sum", factor)."""
    if op == _SUM:          # the common case first: one comparison
        return "sum"
    kind = op if isinstance(op, _RedOpType) else getattr(op, "op", op)
    name = _OPS_BY_VALUE.get(getattr(kind, "value", None))
    if name is not None:
        return name
    if kind == _R.PREMUL_SUM:
        if not PREMUL_FACTOR_READABLE:
            raise InvalidArgument(
                f"PREMUL_SUM: torch {torch.__version__} does not give a Python backend the "
                "op's factor (torch.distributed.ReduceOp.factor, added in a later torch), "
                "so pycoll cannot apply it: upgrade torch, or multiply the tensor by the "
                "factor and use ReduceOp.SUM")
        factor = getattr(op, "factor", None)
        if factor is None:
            raise InvalidArgument("PREMUL_SUM without a factor: build it with "
                                  "torch.distributed._make_nccl_premul_sum(factor)")
        if isinstance(factor, torch.Tensor):
            if factor.numel() != 1:
                raise InvalidArgument(f"PREMUL_SUM factor must be a scalar, got shape "
                                      f"{tuple(factor.shape)}")
            factor = factor.reshape(-1)[0].item()
        return PycollReduceOp("premul_sum", float(factor))
    raise InvalidArgument(f"reduce op {op!r} is not supported by the pycoll backend")


def deterministic() -> bool | None:
    """``deterministic=`` for a reducing call: True while
    ``torch.use_deterministic_algorithms(True)`` is on, else the communicator's default."""
    return True if torch.are_deterministic_algorithms_enabled() else None


def op_timeout(opts: Any) -> float | None:
    """The options object's timeout in seconds; None for "no limit"."""
    return _seconds(getattr(opts, "timeout", None))


def tensor_list(tensors: Any) -> list:
    """One tensor or a sequence of them, as a list."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def one_tensor(tensors: Any, what: str) -> torch.Tensor:
    """The single tensor of a call that takes one per process."""
    tensors = tensor_list(tensors)
    if len(tensors) != 1:
        raise InvalidArgument(f"pycoll backend: {what} takes exactly one tensor per process, "
                              f"got {len(tensors)}")
    return tensors[0]


def group_timeout(timeout: Any, pg_options: Any) -> timedelta:
    """The group's deadline: ``pg_options._timeout`` when torch passed a ``Backend.Options``
    (the more specific setting; torch fills ``timeout`` with its default whether the user gave
    one or not), else torch's ``timeout``. Anything else as options is refused."""
    if pg_options is None:
        return timeout
    if not isinstance(pg_options, _c10d.Backend.Options):
        raise InvalidArgument(f"pycoll backend: pg_options must be torch._C._distributed_c10d."
                              f"Backend.Options or None, not {type(pg_options).__name__}")
    return pg_options._timeout
