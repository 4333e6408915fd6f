"""Planning a call: validate every argument, route buffers by memory type, pick an algorithm.

Everything here runs before a sequence number is taken and before any byte moves, on every
rank, so bad input is a clear ``InvalidArgument`` where it was passed, never a desynchronised
communicator.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..algorithms.cost import WireFormat
from ..algorithms.selection import ORDERED_ALGORITHMS, Selector
from ..buffers.compression import (
    COMPRESSIBLE_DTYPES,
    COMPRESSIBLE_OPS,
    FORMATS,
    OFF,
    Codec,
    Compression,
    check_compress,
    codec,
)
from ..buffers.folding import ACCUMULATE, check_accumulate, order_matters, widens
from ..buffers.memory import CUDA, HOST
from ..buffers.reduction import ReduceOp
from ..buffers.tensors import Buffer, as_buffer
from ..envvars import env_bool, env_choice
from ..errors import InvalidArgument, InvalidDtype
from ..transports.base import Capabilities


def reduction_defaults(deterministic: bool | None, accumulate: str | None,
                       compress: str | None = None) -> dict[str, Any]:
    """A communicator's defaults for reducing calls: the arguments, else
    ``PYCOLL_DETERMINISTIC`` (default off), ``PYCOLL_ACCUMULATE`` (default "fp32") and
    ``PYCOLL_COMPRESS`` (default none: the buffers' own bytes)."""
    det = env_bool("PYCOLL_DETERMINISTIC", False) if deterministic is None else deterministic
    acc = check_accumulate(accumulate, "accumulate") or env_choice(
        "PYCOLL_ACCUMULATE", "fp32", ACCUMULATE)
    squeeze = check_compress(compress, "compress")
    if squeeze is None:
        squeeze = env_choice("PYCOLL_COMPRESS", OFF, (OFF,) + FORMATS)
    if squeeze == OFF:
        squeeze = None
    return {"deterministic": bool(det), "accumulate": acc, "compress": squeeze}


class Planner:
    """Argument checks and algorithm choice for one communicator (rank ``rank`` of ``size``)."""

    def __init__(self, rank: int, size: int, selector: Selector,
                 capabilities: Sequence[Capabilities], *, deterministic: bool = False,
                 accumulate: str = "fp32", compress: str | None = None) -> None:
        self.rank = rank
        self.size = size
        self.selector = selector
        self.capabilities = list(capabilities)
        #: the communicator's defaults for reducing calls (docs/numerics.md)
        self.deterministic = deterministic
        self.accumulate = accumulate
        self.compress = compress
        self._choice_cache: dict[tuple[str, int, bool], str] = {}
        #: the device buffers of the call being planned (``take_device_call`` hands them to
        #: the execution); stays empty while calls pass host buffers only
        self.device_buffers: list = []

    # -- buffers -----------------------------------------------------------------------------
    #: the collectives that run on device buffers directly where every transport moves
    #: device memory; the others are staged through host memory (``pycoll.cuda.staging``)
    DIRECT = frozenset({"allreduce", "broadcast", "reduce", "send", "recv"})

    def twin(self) -> Planner:
        """A planner for a plan's planning copy (``PersistentCollectives._planning_copy``):
        the same settings and choices, its own staging state, so that what it stages and
        gives back never touches a call another thread makes on this planner meanwhile."""
        twin = copy.copy(self)
        twin.device_buffers = []
        devices = self.__dict__.get("_device_calls")
        if devices is not None:
            twin._device_calls = devices.twin()
            twin.device_buffers = twin._device_calls.pending
        return twin

    def begin(self) -> None:
        """A call starts being planned (staging left by a refused call is given back)."""
        if self.device_buffers:
            self._devices().begin()

    def buffer(self, obj: Any, collective: str, *, name: str = "tensor",
               writable: bool = True, reads: bool = True, stage: bool = True,
               direct: bool = True) -> Buffer:
        """Classify ``obj`` and check that this communicator can move and reduce its memory.

        Device memory (``pycoll.cuda.staging``) is used directly where every transport
        moves it (the ``Buffer`` is then a CuPy view of it), else staged through page-locked
        host memory: the ``Buffer`` is the host twin, copied in (``reads``) before the call
        and back (``writable``) after it. ``stage=False`` only classifies it; ``direct=False``
        stages device memory even where it could be used directly (deterministic calls: the
        rank-order fold runs on the host).
        """
        buf = as_buffer(obj, name=name, writable=writable)
        if buf.mem_type != HOST and stage:
            return self._route(buf, collective, name, reads, writable, direct)
        return buf

    def _devices(self) -> Any:
        devices = self.__dict__.get("_device_calls")
        if devices is None:      # made on the first device buffer: CuPy is imported then
            from ..cuda.staging import DeviceCalls
            devices = self._device_calls = DeviceCalls(self.rank)
            self.device_buffers = devices.pending
        return devices

    def take_device_call(self) -> Any:
        """The planned call's device buffers as a ``DirectCall`` or ``StagedCall`` (whose
        ``wrap(body)`` runs the call), their copies or stream ordering queued now."""
        return self._devices().take()

    def device_ops(self) -> Any:
        """The ``MemoryOps`` of device buffers used directly."""
        return self._devices().ops()

    def _route(self, buf: Buffer, collective: str, name: str, reads: bool,
               writes: bool, direct: bool) -> Buffer:
        if buf.mem_type != CUDA:
            raise InvalidArgument(f"rank {self.rank}: {collective}: {name} is {buf.where} "
                                  "memory, which pycoll cannot move")
        if (direct and collective in self.DIRECT
                and all(c.moves(CUDA) for c in self.capabilities)):
            return self._devices().direct(buf, collective, name)
        return self._devices().stage(buf, collective, name, reads=reads, writes=writes)

    def output_list(self, obj: Any, like: Buffer, collective: str, *, writable: bool = True,
                    name: str = "output") -> list[Buffer]:
        """One tensor of ``size * like.count`` elements, or a list of ``size`` tensors."""
        if isinstance(obj, (list, tuple)):
            if len(obj) != self.size:
                raise InvalidArgument(f"rank {self.rank}: {collective}: {name} list has "
                                      f"{len(obj)} tensors, expected world size {self.size}")
            bufs = [self.buffer(t, collective, name=f"{name}[{i}]", writable=writable,
                                reads=not writable) for i, t in enumerate(obj)]
            for b in bufs:
                self.same_dtype(b, like, collective)
                if b.count != like.count:
                    raise InvalidArgument(
                        f"rank {self.rank}: {collective}: {name} tensors must have {like.count} "
                        f"elements each (like the other side), got {b.count}")
            return bufs
        buf = self.buffer(obj, collective, name=name, writable=writable, reads=not writable)
        self.same_dtype(buf, like, collective)
        if buf.count != like.count * self.size:
            raise InvalidArgument(
                f"rank {self.rank}: {collective}: {name} has {buf.count} elements; it needs "
                f"world size x {like.count} = {like.count * self.size}")
        return [buf]

    def out_of_place(self, tensor: Any, out: Any, collective: str) -> bool:
        """Whether ``out=`` (not None) is another buffer than ``tensor`` (False: the same
        memory, which is the in-place call).

        Checked before anything is staged or numbered, on every rank that passes ``out``: it
        must be writable and have ``tensor``'s shape, dtype and memory kind, and must not
        overlap it partly (the copy of the input into it would overwrite input not yet
        read)."""
        where = f"rank {self.rank}: {collective}"
        src = as_buffer(tensor, name=f"{where}: tensor", writable=False)
        dst = as_buffer(out, name=f"{where}: out", writable=True)
        if dst.dtype != src.dtype:
            raise InvalidDtype(f"{where}: out has dtype {dst.dtype} but tensor has "
                               f"{src.dtype}; pass an out of the tensor's dtype (nothing "
                               "was sent)")
        shapes = _shape(tensor, src), _shape(out, dst)
        if shapes[0] != shapes[1]:
            raise InvalidArgument(f"{where}: out has shape {shapes[1]} but tensor has "
                                  f"{shapes[0]}; pass an out of the tensor's shape (nothing "
                                  "was sent)")
        if (dst.mem_type, dst.device) != (src.mem_type, src.device):
            raise InvalidArgument(f"{where}: out is in {dst.where} memory but tensor in "
                                  f"{src.where}; pass an out in the tensor's memory, or copy "
                                  "the result over afterwards (nothing was sent)")
        a, b = _extent(src), _extent(dst)
        if a is None or b is None:          # an object whose address is not known
            return out is not tensor
        if a == b:
            return False
        if a[0] < b[0] + b[1] and b[0] < a[0] + a[1]:
            raise InvalidArgument(f"{where}: out overlaps tensor without being the same "
                                  "memory; pass a separate out, or omit out= (or pass the "
                                  "tensor itself) for the in-place call (nothing was sent)")
        return True

    def split_bounds(self, obj: Any, buf: Buffer, splits: Sequence[int] | None,
                     what: str, collective: str = "alltoall") -> list[tuple[int, int]]:
        """Element bounds of each rank's block of a buffer cut into rows of dimension 0
        (alltoall's splits, the counts of reduce_scatter_v, gatherv and scatterv)."""
        shape = tuple(getattr(obj, "shape", (buf.count,))) or (1,)
        rows = shape[0]
        row = buf.count // rows if rows else 0
        if splits is None:
            if rows % self.size:
                raise InvalidArgument(
                    f"rank {self.rank}: {collective}: first dimension {rows} is not divisible "
                    f"by the world size {self.size}; pass {what} to split it unevenly")
            splits = [rows // self.size] * self.size
        try:
            splits = [self._int(s, what) for s in splits]
        except TypeError:
            raise InvalidArgument(f"rank {self.rank}: {collective}: {what} must be a sequence of "
                                  f"{self.size} ints, not {splits!r}") from None
        if len(splits) != self.size or any(s < 0 for s in splits) or sum(splits) != rows:
            raise InvalidArgument(
                f"rank {self.rank}: {collective}: {what}={splits} must be {self.size} non-negative "
                f"row counts adding up to the first dimension ({rows})")
        bounds, start = [], 0
        for s in splits:
            bounds.append((start * row, (start + s) * row))
            start += s
        return bounds

    def _int(self, value: Any, what: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise InvalidArgument(f"rank {self.rank}: {what} must hold ints, not {value!r}")
        return int(value)

    # -- scalars -----------------------------------------------------------------------------
    def check_rank(self, value: Any, what: str, collective: str) -> int:
        if type(value) is int and 0 <= value < self.size:   # the common case, fast
            return value
        if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                or not 0 <= int(value) < self.size):
            raise InvalidArgument(f"rank {self.rank}: {collective}: {what}={value!r} is not a rank "
                                  f"of this communicator (0..{self.size - 1})")
        return int(value)

    def check_peer(self, peer: Any, what: str, op: str, tag: Any, limit: int) -> None:
        """``peer`` is another rank (None: any source, which needs another rank to exist)."""
        if peer is None:
            if self.size < 2:
                raise InvalidArgument(f"rank {self.rank}: {op} from any source in a "
                                      "communicator of one rank would never complete")
        else:
            self.check_rank(peer, what, op)
            if int(peer) == self.rank:
                raise InvalidArgument(f"rank {self.rank}: {op} to/from itself ({what}={peer})")
        if (isinstance(tag, bool) or not isinstance(tag, (int, np.integer))
                or not 0 <= tag < limit):
            raise InvalidArgument(f"rank {self.rank}: {op}: tag must be an int in "
                                  f"[0, 2**40), not {tag!r}")

    def same_dtype(self, a: Buffer, b: Buffer, collective: str) -> None:
        if a.dtype != b.dtype:
            raise InvalidDtype(f"rank {self.rank}: {collective}: output dtype {a.dtype} differs "
                               f"from input dtype {b.dtype}")

    # -- the reduction order ------------------------------------------------------------------
    def is_deterministic(self, deterministic: bool | None) -> bool:
        """A call's ``deterministic=`` with the communicator's default filled in."""
        return self.deterministic if deterministic is None else bool(deterministic)

    def fold_mode(self, collective: str, rop: ReduceOp, buf: Buffer,
                  deterministic: bool | None, accumulate: str | None,
                  algo: str | None) -> str | None:
        """How a reducing call folds: None (its algorithm's own order, in the dtype), or in
        rank order (docs/numerics.md) accumulating in ``"dtype"`` or ``"fp32"``.

        Rank order where ``deterministic`` asks for it and the order matters (floating-point
        sums and products: integer, min, max and bitwise results are exact in any order),
        and for float16/bfloat16 sums accumulated in float32 (``accumulate``, default the
        communicator's: "fp32"), which only the rank-order fold does. A call that forces an
        algorithm with ``algo=`` and leaves ``accumulate`` to the default keeps that
        algorithm's arithmetic (the dtype); device memory used directly too.
        """
        check_accumulate(accumulate, f"rank {self.rank}: {collective}")
        det = self.is_deterministic(deterministic)
        wanted = accumulate or self.accumulate
        if accumulate is None and algo is not None and algo not in ORDERED_ALGORITHMS:
            wanted = "dtype"
        wide = buf.mem_type == HOST and widens(rop, buf.dtype, wanted)
        if wide:
            return "fp32"
        if det and order_matters(rop, buf.dtype):
            return "dtype"
        return None

    # -- compression (docs/numerics.md, "Compressed collectives") -----------------------------
    def wants_compress(self, compress: str | None) -> bool:
        """Whether a call may be compressed (asked, or the communicator's default): its
        device buffers are then staged, since the codecs run on the host."""
        return compress != OFF and (compress or self.compress) is not None

    def compression(self, collective: str, compress: str | None, dtype: str,
                    rop: ReduceOp | None, *, accumulate: str | None = None,
                    integrity: bool | None = None) -> Compression | None:
        """The wire format of a call: ``compress`` as asked (refused, before any byte moves,
        where it cannot apply: integer dtypes, ops other than sum/avg/premul_sum), else the
        communicator's default where it applies (other calls move their own bytes: they are
        exact, compression never changes them unasked), else None."""
        where = f"rank {self.rank}: {collective}"
        fmt = check_compress(compress, where)
        if fmt == OFF:
            return None
        if fmt is None:
            fmt = self.compress
            if (fmt is None or dtype not in COMPRESSIBLE_DTYPES
                    or (rop is not None and rop.name not in COMPRESSIBLE_OPS)
                    or accumulate == "dtype" or integrity):
                return None
            return Compression.of(fmt, rop, dtype, self.size)
        if dtype not in COMPRESSIBLE_DTYPES:
            raise InvalidDtype(
                f"{where}: compress={fmt!r} applies to float16, bfloat16, float32 and float64 "
                f"buffers, not {dtype}: integer results are exact and stay so; call it "
                "without compress=")
        if rop is not None and rop.name not in COMPRESSIBLE_OPS:
            raise InvalidArgument(
                f"{where}: compress={fmt!r} applies to sum, avg and premul_sum, not "
                f"op={rop.name!r}, whose result would come from quantised inputs; call it "
                "without compress=")
        if accumulate == "dtype":
            raise InvalidArgument(f"{where}: compress={fmt!r} accumulates in float32 (float64 "
                                  "for float64); accumulate='dtype' contradicts it")
        if integrity:
            raise InvalidArgument(f"{where}: integrity=True checks results against the exact "
                                  f"sum, which compress={fmt!r} does not return; pass one of "
                                  "them")
        return Compression.of(fmt, rop, dtype, self.size)

    # -- algorithms --------------------------------------------------------------------------
    def compression_pays(self, collective: str, nbytes: int, compress: str,
                         dtype: str) -> bool:
        """Whether the cost model expects ``compress=`` to make the call faster here."""
        if dtype not in COMPRESSIBLE_DTYPES:
            raise InvalidArgument(f"compression_pays: dtype {dtype!r} is not compressed; "
                                  "compress= takes " + ", ".join(sorted(COMPRESSIBLE_DTYPES)))
        itemsize = 8 if dtype == "float64" else 4 if dtype == "float32" else 2
        return self.selector.compression_pays(collective, nbytes, self.size,
                                              _wire_format(codec(compress), itemsize))

    def select(self, collective: str, nbytes: int, algo: str | None = None,
               ordered: bool = False, compressed: Compression | None = None,
               itemsize: int = 1) -> str:
        """The algorithm for ``collective`` on ``nbytes`` (cached: every call asks);
        ``ordered``: one that folds in rank order; ``compressed``: one that moves that
        wire format (of a buffer of ``itemsize``-byte elements)."""
        if compressed is not None:
            return self.selector.choose(collective, nbytes, self.size, algo,
                                        wire=_wire_format(compressed.codec, itemsize))
        if algo is None:
            key = (collective, nbytes, ordered)
            found = self._choice_cache.get(key)
            if found is None:
                found = self.selector.choose(collective, nbytes, self.size, ordered=ordered)
                if len(self._choice_cache) < 4096:
                    self._choice_cache[key] = found
            return found
        return self.selector.choose(collective, nbytes, self.size, algo, ordered=ordered)


def _shape(obj: Any, buf: Buffer) -> tuple[int, ...]:
    """The shape the caller sees (the element count for objects without one)."""
    shape = getattr(obj, "shape", None)
    try:
        return tuple(int(d) for d in shape) if shape is not None else (buf.count,)
    except TypeError:
        return (buf.count,)


def _extent(buf: Buffer) -> tuple[int, int] | None:
    """(address, bytes) of a classified buffer's memory; None where it cannot be told."""
    arr = buf.array
    if buf.mem_type == HOST:
        return arr.__array_interface__["data"][0], buf.nbytes
    if hasattr(arr, "data_ptr"):
        return int(arr.data_ptr()), buf.nbytes
    cai = getattr(arr, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0]), buf.nbytes
    return None


def _wire_format(c: Codec, itemsize: int) -> WireFormat:
    """What the cost model prices for a compressed call in ``c`` of ``itemsize``-byte
    elements: its wire ratio and the speed of the codec that will run."""
    return WireFormat(c.ratio(itemsize), c.pass_gbps())
