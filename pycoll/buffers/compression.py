"""Wire formats of compressed collectives (``compress=``): encode, decode, and the error bound.

A compressed collective changes only what travels: every rank accumulates in float32 (float64
for float64 inputs), and each value on the wire is quantised by exactly one rank, the one that
sends it, so every rank that decodes the same bytes gets the same bits (docs/numerics.md,
"Compressed collectives"). This module is the one place that knows the formats:

* ``"bf16"``: bfloat16, rounded to nearest even; float32's range, so no scale.
* ``"fp16"``, ``"fp8"`` (OCP e4m3fn) and ``"int8"``: blocks of ``BLOCK`` elements, each with a
  float32 scale ``s = max|x| / FMAX`` (rounded up, so that no element of the block saturates
  beyond one rounding), and ``x / s`` rounded to nearest even (int8: symmetric, -127..127).

The blocks are cut on a grid that starts at the first element of the buffer a collective
encodes (``Codec.encode``'s caller keeps pieces aligned to it), so an element is always
quantised with the same neighbours, whichever rank or algorithm encodes it.

Non-finite values: NaN stays NaN in every format; +-inf stays +-inf in bf16 and fp16, and
becomes NaN in fp8 and int8, which have no infinity. The scale of a block is the largest
*finite* magnitude, so one inf or NaN does not wipe out its block's other elements. A float64
block whose scale overflows float32 decodes as NaN.

Wire layout of ``count`` elements: the blocks' float32 scales first (4 bytes each, keeping the
payload aligned), then one code per element (2 bytes for bf16/fp16, 1 for fp8/int8).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .reduction import ReduceOp, _bf16_to_f32, _f32_to_bf16, finish, needs_finish

#: the formats ``compress=`` accepts
FORMATS = ("bf16", "fp16", "fp8", "int8")
#: the smallest scale (float32's smallest normal number): its inverse is finite
MIN_SCALE = np.float32(2.0 ** -126)
#: elements per scaled block (each carries one float32 scale: 1.6 % of an fp8 block's bytes)
BLOCK = 256
#: input dtypes that may be compressed (integers are exact and must stay exact)
COMPRESSIBLE_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
#: ops whose result is a sum of the inputs (prod, min, max: a quantised operand would change
#: which element wins or multiply errors; they are refused)
COMPRESSIBLE_OPS = frozenset({"sum", "avg", "premul_sum"})


def _e4m3_values() -> np.ndarray:
    """The float32 value of each of the 256 e4m3fn codes (0x7F and 0xFF: NaN)."""
    codes = np.arange(256)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    mag = np.where(exp == 0, man * 2.0 ** -9, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    values = np.where(codes & 0x80, -mag, mag).astype(np.float32)
    values[[0x7F, 0xFF]] = np.nan
    return values


_E4M3 = _e4m3_values()
_E4M3_POSITIVE = _E4M3[:0x7F].copy()         # codes 0..126, ascending
#: the float32 value of each of the 65536 float16 codes (the compiled fp16 decode's table)
_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

#: the float32 value of each int8 code (-128: NaN), as ``decode_numpy`` gives it
_INT8 = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)
_INT8[0x80] = np.nan

_kernels: list[Any] = []


def compiled_kernels() -> Any:
    """``codec_kernels`` (the compiled codecs), or None where numba cannot load: then the
    numpy codec runs, with the same bits. Imported at the first compressed call, not with
    pycoll, so that a process that never compresses does not pay numba's import."""
    if not _kernels:
        found: Any
        try:
            from . import codec_kernels
            found = codec_kernels
        except Exception:  # noqa: BLE001 - numba missing or broken: the numpy codec
            found = None
        _kernels.append(found)
    return _kernels[0]


def _fits(*arrays: np.ndarray) -> bool:
    """Whether the compiled codec takes these arrays (contiguous float32/float64 data)."""
    return all(a.flags.c_contiguous for a in arrays)


def _encode_e4m3(y: np.ndarray, out: np.ndarray) -> None:
    """``out`` (uint8) = e4m3fn codes of ``y`` (float32 or float64, |y| <= 448 up to a
    rounding: larger magnitudes saturate to 448), nearest even; NaN and inf -> 0x7F."""
    a = np.abs(y)
    _, e = np.frexp(a)                       # a = f * 2**e, f in [0.5, 1)
    quantum = np.ldexp(np.ones_like(a), np.maximum(e - 1, -6) - 3)   # spacing at a's binade
    v = np.rint(a / quantum) * quantum       # exact division by a power of two; rint: even
    np.minimum(v, 448.0, out=v)
    bad = ~np.isfinite(a)
    v[bad] = 0.0
    code = np.searchsorted(_E4M3_POSITIVE, v).astype(np.uint8)   # v is on the grid: exact
    code |= np.signbit(y).astype(np.uint8) << 7
    code[bad] = 0x7F
    out[...] = code


@dataclass(frozen=True)
class Codec:
    """One wire format: ``encode``/``decode`` and what the error bound needs of it.

    ``unit``: the unit roundoff of the format's significand (relative error of one rounding);
    ``floor``: half the smallest spacing of the format, times the scale (the absolute error
    of rounding a value far below the block's maximum); ``fmax``: the largest magnitude
    the scale maps a block's maximum to (0: unscaled).

    ``gbps`` and ``numpy_gbps``: the cost model's speed of one pass (input GB/s, an encode
    and a decode averaged) of the compiled codec and of the numpy one, set below what
    ``benchmarks/codec_speed.py`` measured on a loaded 2-core machine (docs/performance.md),
    so that selection does not promise a gain the codec cannot give.
    """

    name: str
    code_bytes: int
    unit: float
    floor: float
    fmax: float
    gbps: float
    numpy_gbps: float

    @property
    def scaled(self) -> bool:
        return self.fmax > 0

    def blocks(self, count: int) -> int:
        return -(-count // BLOCK) if self.scaled else 0

    def wire_nbytes(self, count: int) -> int:
        """Bytes on the wire for ``count`` elements (scales and codes)."""
        return 4 * self.blocks(count) + self.code_bytes * count

    def ratio(self, itemsize: int) -> float:
        """Wire bytes per input byte, for large buffers (the cost model's factor)."""
        per = self.code_bytes + (4 / BLOCK if self.scaled else 0.0)
        return per / itemsize

    def pass_gbps(self) -> float:
        """Input GB/s of one pass of the codec that will run here (the cost model's)."""
        return self.gbps if compiled_kernels() is not None else self.numpy_gbps

    # -- encode ------------------------------------------------------------------------------
    def encode(self, src: np.ndarray, out: np.ndarray) -> None:
        """``out`` (uint8, ``wire_nbytes(src.size)``) = ``src`` (float32 or float64) encoded:
        compiled where numba loads, else ``encode_numpy`` (the same bits)."""
        k = compiled_kernels()
        if k is None or src.dtype not in (np.float32, np.float64) or not _fits(src, out):
            self.encode_numpy(src, out)
            return
        src = src.reshape(-1)
        count = src.size
        if not self.scaled:
            k.encode_bf16(src, out.view(np.uint16))
            return
        nb = self.blocks(count)
        if count and src.dtype == np.float32:
            k.encode_scaled32(src, src.view(np.uint32), out[:4 * nb].view(np.float32),
                              self._codes(out, nb, count), _KERNEL_FORMAT[self.name],
                              self.fmax, BLOCK)
        elif count:
            k.encode_scaled(src, out[:4 * nb].view(np.float32), out[4 * nb:],
                            _KERNEL_FORMAT[self.name], self.fmax, BLOCK,
                            src.dtype == np.float64)

    def encode_numpy(self, src: np.ndarray, out: np.ndarray) -> None:
        """``encode`` in numpy: the reference the compiled codec equals bit for bit."""
        count = src.size
        if not self.scaled:
            _f32_to_bf16(src.astype(np.float32, copy=False), out.view(np.uint16))
            return
        nb = self.blocks(count)
        scales = out[:4 * nb].view(np.float32)
        codes = out[4 * nb:]
        if count == 0:
            return
        starts = np.arange(0, count, BLOCK)
        mag = np.abs(src)
        amax = np.maximum.reduceat(mag, starts)
        if not np.isfinite(amax).all():          # the largest *finite* magnitude
            mag[~np.isfinite(mag)] = 0.0
            amax = np.maximum.reduceat(mag, starts)
        wanted = amax.astype(np.float64) / self.fmax
        with np.errstate(over="ignore"):         # beyond float32: NaN below, as documented
            s = wanted.astype(np.float32)
        low = s < wanted                         # round the scale up: no element saturates
        s[low] = np.nextafter(s[low], np.float32(np.inf))
        # zeros (and non-finite) only: any scale is exact. At least float32's smallest normal
        # number, so that 1 / s is finite: blocks of subnormal values share a fixed grid
        np.maximum(s, MIN_SCALE, out=s)
        s[amax == 0] = 1.0
        scales[...] = s
        wide = src.dtype == np.float64
        inv = (1.0 / s.astype(np.float64)) if wide else (np.float32(1.0) / s)
        y = src * np.repeat(inv, BLOCK)[:count]
        overflow = ~np.isfinite(s)               # float64 blocks beyond float32's range
        if overflow.any():
            y[np.repeat(overflow, BLOCK)[:count]] = np.nan
        if self.name == "fp8":
            _encode_e4m3(y, codes)
        elif self.name == "int8":
            q = np.clip(np.rint(y), -127, 127)
            q[~np.isfinite(y)] = -128            # the NaN code (inf too: int8 has none)
            codes.view(np.int8)[...] = q
        else:                                    # fp16: saturate finite values only
            finite = np.isfinite(y)
            y = np.where(finite, np.clip(y, -self.fmax, self.fmax), y)
            codes.view(np.float16)[...] = y

    # -- decode ------------------------------------------------------------------------------
    def decode(self, wire: np.ndarray, out: np.ndarray) -> None:
        """``out`` (float32 or float64) = the values ``wire`` encodes (``out.size`` of them):
        compiled where numba loads, else ``decode_numpy`` (the same bits)."""
        self._decode(wire, out, False)

    def decode_add(self, wire: np.ndarray, acc: np.ndarray) -> None:
        """``acc += `` the values ``wire`` encodes, with the bits of ``decode`` into a scratch
        array and ``acc += scratch`` (one rounding per element), without that array: the
        compressed fold adds every rank's piece this way."""
        self._decode(wire, acc, True)

    def _decode(self, wire: np.ndarray, out: np.ndarray, add: bool) -> None:
        k = compiled_kernels()
        if k is None or out.dtype not in (np.float32, np.float64) or not _fits(wire, out):
            if add:
                part = np.empty_like(out)
                self.decode(wire, part)
                out += part
            else:
                self.decode_numpy(wire, out)
            return
        count = out.size
        flat = out.reshape(-1)
        if not self.scaled:
            (k.decode_add_bf16 if add else k.decode_bf16)(wire[:2 * count].view(np.uint16), flat)
            return
        nb = self.blocks(count)
        table = {"fp16": _F16, "fp8": _E4M3, "int8": _INT8}[self.name]
        scales = wire[:4 * nb].view(np.float32)
        fmt = _KERNEL_FORMAT[self.name]
        if flat.dtype == np.float32:
            k.decode_scaled32(scales, self._codes(wire, nb, count), flat, fmt, table, BLOCK, add)
        else:       # float64: the exact product, then one rounding if added
            k.decode_scaled(scales, wire[4 * nb:4 * nb + self.code_bytes * count], flat, fmt,
                            table, BLOCK, add)

    def _codes(self, wire: np.ndarray, nb: int, count: int) -> np.ndarray:
        """The codes of ``count`` elements after ``nb`` scales, one element each (the
        float32 kernels' view: uint16 for fp16, uint8 else)."""
        codes = wire[4 * nb:4 * nb + self.code_bytes * count]
        return codes.view(np.uint16) if self.code_bytes == 2 else codes

    def decode_numpy(self, wire: np.ndarray, out: np.ndarray) -> None:
        """``decode`` in numpy: the reference the compiled codec equals bit for bit."""
        count = out.size
        if not self.scaled:
            out[...] = _bf16_to_f32(wire[:2 * count].view(np.uint16))
            return
        nb = self.blocks(count)
        scales = wire[:4 * nb].view(np.float32)
        codes = wire[4 * nb:4 * nb + self.code_bytes * count]
        if self.name == "fp8":
            values = _E4M3[codes]
        elif self.name == "int8":
            ints = codes.view(np.int8)
            values = ints.astype(np.float32)
            values[ints == -128] = np.nan
        else:
            values = codes.view(np.float16).astype(np.float32)
        np.multiply(values, np.repeat(scales, BLOCK)[:count], out=out, dtype=out.dtype)


#: the compiled codec's number for each scaled format (``codec_kernels``)
_KERNEL_FORMAT = {"fp16": 0, "fp8": 1, "int8": 2}

CODECS: dict[str, Codec] = {
    "bf16": Codec("bf16", 2, 2.0 ** -8, 2.0 ** -134, 0.0, 8.0, 0.6),
    "fp16": Codec("fp16", 2, 2.0 ** -11, 2.0 ** -25, 65504.0, 2.0, 0.4),
    "fp8": Codec("fp8", 1, 2.0 ** -4, 2.0 ** -10, 448.0, 2.0, 0.05),
    "int8": Codec("int8", 1, 0.0, 0.5, 127.0, 3.0, 0.4),
}


def codec(name: str) -> Codec:
    found = CODECS.get(name)
    if found is None:
        raise InvalidArgument(f"compress={name!r} is not a wire format; choose one of "
                              + ", ".join(map(repr, FORMATS)))
    return found


#: ``compress=`` of a call that must move its own bytes whatever the communicator's default
OFF = "none"


def check_compress(value: str | None, where: str) -> str | None:
    """``value`` if it names a format, ``OFF`` or None; InvalidArgument naming ``where``
    else."""
    if value is not None and value not in CODECS and value != OFF:
        raise InvalidArgument(f"{where}: compress={value!r} is not a wire format; choose one "
                              "of " + ", ".join(map(repr, FORMATS)) + f", {OFF!r} (this "
                              "call uncompressed) or None (the communicator's default)")
    return value


def acc_dtype(dtype: str) -> np.dtype:
    """What a compressed call accumulates in: float64 for float64, float32 otherwise."""
    return np.dtype(np.float64 if dtype == "float64" else np.float32)


def to_acc(arr: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """``out`` (the accumulation dtype) = ``arr`` (bfloat16 as uint16 bits), exactly."""
    if dtype == "bfloat16":
        out[...] = _bf16_to_f32(arr)
    else:
        out[...] = arr


def from_acc(acc: np.ndarray, dtype: str, out: np.ndarray) -> None:
    """``out`` (the buffer's dtype) = ``acc`` rounded once, to nearest even."""
    if dtype == "bfloat16":
        _f32_to_bf16(acc.astype(np.float32, copy=False), out)
    else:
        out[...] = acc


def aligned_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges of ``count`` elements that start on the block grid (whole
    blocks, nearly equally many each), so that a piece encodes the blocks the whole does."""
    blocks = -(-count // BLOCK)
    base, extra = divmod(blocks, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((min(start * BLOCK, count), min(stop * BLOCK, count)))
        start = stop
    return bounds


def _unchanged(_: np.ndarray) -> None:
    """The finishing step of sum and premul_sum: nothing."""


@dataclass(frozen=True)
class Compression:
    """What a compressed algorithm needs: the wire format, the buffer's dtype, what it
    accumulates in, and the finishing step (avg's scale) applied to the accumulator, before
    the owner quantises the result."""

    codec: Codec
    dtype: str
    finish: Callable[[np.ndarray], None] = _unchanged

    @property
    def acc(self) -> np.dtype:
        return acc_dtype(self.dtype)

    @staticmethod
    def of(fmt: str, op: ReduceOp | None, dtype: str, world_size: int) -> Compression:
        acc = acc_dtype(dtype).name
        fin = ((lambda a: finish(op, acc, a, world_size))
               if op is not None and needs_finish(op, world_size) else _unchanged)
        return Compression(codec(fmt), dtype, fin)


# -- the bound (docs/numerics.md, "Compressed collectives") -----------------------------------
def step_error(fmt: str, dtype: str = "float32") -> tuple[float, float, float]:
    """(rho, eta, tiny) of one quantisation: ``|decode(encode(x)) - x| <= rho |x| + eta *
    amax + tiny``, amax the largest finite magnitude of x's block. rho: the format's rounding
    and the float32 arithmetic of scaling and decoding; eta: the format's smallest spacing at
    the block's scale (rounded up); tiny: the fixed grid of blocks whose scale is
    ``MIN_SCALE``, the format's own subnormals (bf16), float32's."""
    c = codec(fmt)
    arith = 2.0 ** -22 if dtype != "float64" or c.scaled else 2.0 ** -23
    if not c.scaled:
        return c.unit + arith, 0.0, c.floor + TINY
    return c.unit + arith, c.floor * (1 + 2.0 ** -22) / c.fmax, c.floor * 2.0 ** -126 + TINY


#: float32's smallest subnormal: the absolute slack of one float32 rounding near zero
TINY = 2.0 ** -149


def error_bound(inputs: Sequence[np.ndarray], fmt: str, dtype: str = "float32",
                collective: str = "allreduce", avg: bool = False) -> np.ndarray:
    """Element-wise bound on ``|result - exact|`` of a compressed call over ``inputs`` (each
    rank's input, rank order, float values; non-finite elements are left out of the blocks'
    maxima and their bounds are meaningless). Blocks start at the inputs' first element:
    pass the piece a call encodes on one grid (the whole buffer of allreduce and broadcast,
    one rank's block of allgather and reduce_scatter).

    allreduce: every input quantised once, the fold in the accumulation dtype (n - 1
    roundings), the result quantised once; reduce_scatter: the same without the last
    quantisation; allgather, broadcast: one quantisation. ``dtype``: the buffers' dtype
    (float16/bfloat16 results are rounded to it once more). ``avg``: the sum's bound / n.
    """
    xs = [np.where(np.isfinite(x), np.abs(np.asarray(x, dtype=np.float64)), 0.0).ravel()
          for x in inputs]
    n = len(xs)
    rho, eta, tiny = step_error(fmt, dtype)
    count = xs[0].size

    def block_max(v: np.ndarray) -> np.ndarray:
        if eta == 0.0 or count == 0:
            return np.zeros_like(v)
        starts = np.arange(0, count, BLOCK)
        return np.repeat(np.maximum.reduceat(v, starts), BLOCK)[:count]

    if collective in ("allgather", "broadcast"):
        bound = rho * xs[0] + eta * block_max(xs[0]) + tiny
    else:
        m = np.sum(xs, axis=0)
        a = np.sum([block_max(x) for x in xs], axis=0)
        u = 2.0 ** -53 if dtype == "float64" else 2.0 ** -24
        gamma = (n - 1) * u / (1 - (n - 1) * u)
        e1 = rho * m + eta * a + n * tiny                 # every input quantised once
        xhat = (1 + rho) * m + eta * a + n * tiny         # what the fold adds up
        bound = e1 + gamma * xhat + (n - 1) * TINY        # the fold's n - 1 roundings
        fmag = (1 + gamma) * xhat + (n - 1) * TINY        # |the owner's sum| at most
        amax = block_max(fmag)                            # its block's maximum at most
        if avg:                                           # times 1/n, rounded once
            bound, fmag, amax = bound / n, fmag / n, amax / n
            bound = bound + 2.0 ** -23 * fmag + TINY
        if collective == "allreduce":                     # the owner's result quantised
            bound = bound + rho * fmag + eta * amax + tiny
    if dtype in ("float16", "bfloat16"):
        exact = np.abs(np.sum(xs, axis=0)) if collective not in ("allgather", "broadcast") \
            else xs[0]
        if avg and collective not in ("allgather", "broadcast"):
            exact = exact / n
        half_u, half_tiny = ((2.0 ** -11, 2.0 ** -25) if dtype == "float16"
                             else (2.0 ** -8, 2.0 ** -134))
        bound = bound + half_u * (exact + bound) + half_tiny
    return bound


def reference_encode_decode(x: np.ndarray, fmt: str) -> np.ndarray:
    """``decode(encode(x))`` in x's accumulation dtype, for tests and users."""
    c = codec(fmt)
    wire = np.empty(c.wire_nbytes(x.size), dtype=np.uint8)
    c.encode(x.ravel(), wire)
    out = np.empty(x.size, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    c.decode(wire, out)
    return out



def reference(inputs: Sequence[np.ndarray], fmt: str, op: ReduceOp | str = "sum",
              dtype: str | None = None) -> np.ndarray:
    """What a compressed allreduce returns on every rank for the ranks' ``inputs`` (rank
    order; bfloat16 as uint16 bits with ``dtype="bfloat16"``): per owner's chunk of whole
    blocks, every input quantised, the decoded pieces folded in rank order in the
    accumulation dtype, avg's scale, the result quantised once and decoded. For checking a
    result, or reproducing one without the job."""
    from .reduction import parse_op, prepare
    rop = parse_op(op)
    arrays = [np.array(x).reshape(-1) for x in inputs]
    name = dtype or arrays[0].dtype.name
    n = len(arrays)
    for a in arrays:
        prepare(rop, name, a)
    comp = Compression.of(fmt, rop, name, n)
    c = comp.codec
    out = np.empty_like(arrays[0])
    for lo, hi in aligned_bounds(out.size, n):
        acc = None
        for a in arrays:
            wide = np.empty(hi - lo, dtype=comp.acc)
            to_acc(a[lo:hi], name, wide)
            wire = np.empty(c.wire_nbytes(hi - lo), dtype=np.uint8)
            c.encode(wide, wire)
            c.decode(wire, wide)
            acc = wide if acc is None else acc + wide
        assert acc is not None
        comp.finish(acc)
        wire = np.empty(c.wire_nbytes(hi - lo), dtype=np.uint8)
        c.encode(acc, wire)
        c.decode(wire, acc)
        from_acc(acc, name, out[lo:hi])
    return out.reshape(np.shape(inputs[0]))
