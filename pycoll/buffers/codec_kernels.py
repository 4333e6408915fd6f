"""Compiled encode/decode of the wire formats (numba, GIL released): ``compression.Codec``'s
fast path.

Each kernel produces exactly the bits of the numpy codec in ``compression.py`` (the
reference, and the path where numba cannot load): the same float32/float64 arithmetic in the
same order, without fastmath, so no contraction or reassociation changes a rounding. Where
numpy goes through an intermediate (fp8's grid search, the repeated scales), the kernel
computes the same value directly; tests/algorithms/test_compression.py checks every format
and input dtype bit for bit against the numpy codec.

A scaled format runs one block at a time: the block's largest finite magnitude, its scale,
then its codes, while the block is in cache (numpy makes about ten passes over the buffer).

Non-finite values follow the numpy codec, including NaN payloads: an arithmetic NaN keeps its
sign and payload (quieted), which is what x86 and aarch64 multiplication does to a NaN operand.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_jit = njit(nogil=True, cache=True)

#: formats as the kernels number them
FP16, FP8, INT8 = 0, 1, 2
_MIN_SCALE = np.float32(2.0 ** -126)


@_jit
def _exponent(a):  # pragma: no cover - compiled
    """floor(log2(a)) of a finite float64 ``a`` > 0 from its bits (-1023 for subnormals:
    below every format's grid, where only the "smallest binade" branch matters)."""
    return np.int64((np.float64(a).view(np.uint64) >> np.uint64(52)) & np.uint64(0x7FF)) - 1023


@_jit
def _pow2(n):  # pragma: no cover - compiled
    """2.0 ** n for -1022 <= n <= 1023, exactly, from its bits."""
    return np.uint64(np.uint64(n + 1023) << np.uint64(52)).view(np.float64)


@_jit
def _half_bits(y):  # pragma: no cover - compiled
    """IEEE binary16 bits of ``y`` (float32 or float64), nearest even, as numpy's cast
    (directly from ``y``'s precision: no double rounding). NaN keeps sign and payload."""
    if y != y:
        b = np.float64(y).view(np.uint64)
        sign = np.uint16((b >> np.uint64(48)) & np.uint64(0x8000))
        h = np.uint16(0x7C00) | np.uint16((b >> np.uint64(42)) & np.uint64(0x3FF))
        if h == 0x7C00:
            h += np.uint16(1)
        return sign | h
    d = np.float64(y)
    sign = np.uint16(0x8000) if np.signbit(d) else np.uint16(0)
    a = abs(d)
    E = _exponent(a)
    if E > 15:                               # inf (finite values were saturated before)
        return sign | np.uint16(0x7C00)
    if E < -14:                              # subnormal half: multiples of 2**-24
        return sign | np.uint16(np.rint(a * 2.0 ** 24))
    k = np.int64(np.rint(a * _pow2(10 - E)))     # 1024..2048: exact scaling
    code = ((E + 15) << 10) + k - 1024       # k == 2048 carries into the next binade
    if code >= 0x7C00:
        code = 0x7C00
    return sign | np.uint16(code)


@_jit
def _e4m3_code(y):  # pragma: no cover - compiled
    """e4m3fn code of ``y`` (|y| beyond 448 saturates; NaN and inf -> 0x7F), nearest even."""
    a = abs(np.float64(y))
    if not np.isfinite(a):
        return np.uint8(0x7F)
    sign = np.uint8(0x80) if np.signbit(y) else np.uint8(0)
    if a == 0.0:
        return sign
    E = max(_exponent(a), -6)                # the binade's exponent (subnormals share -6)
    if E > 8:
        return sign | np.uint8(0x7E)
    k = np.int64(np.rint(a * _pow2(3 - E)))      # multiples of the binade's spacing: exact
    code = (E + 7) * 8 + k - 8               # k == 16 carries into the next binade
    if code > 0x7E:                          # 448
        code = 0x7E
    return sign | np.uint8(code)


@_jit
def encode_bf16(src, codes):  # pragma: no cover - compiled
    """``codes`` (uint16) = ``src`` rounded to float32, then to bfloat16, nearest even."""
    for i in range(src.size):
        f = np.float32(src[i])
        u = f.view(np.uint32)
        if f != f:
            codes[i] = np.uint16((u >> np.uint32(16)) | np.uint32(0x40))
        else:
            r = ((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
            codes[i] = np.uint16(((u + r) >> np.uint32(16)) & np.uint32(0xFFFF))


@_jit
def decode_bf16(codes, out):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = np.uint32(np.uint32(codes[i]) << np.uint32(16)).view(np.float32)


@_jit
def _block_scale(src, lo, hi, fmax):  # pragma: no cover - compiled
    """The scale of ``src[lo:hi]`` as ``Codec.encode_numpy`` computes it: the largest finite
    magnitude / fmax in float64, rounded up to float32, at least float32's smallest normal,
    1 for a block of zeros (and non-finite values)."""
    amax = 0.0                               # float64 holds either dtype exactly
    for i in range(lo, hi):
        m = abs(src[i])
        if m > amax and m != np.inf:         # NaN compares false
            amax = m
    return _scale_of(amax, fmax)


@_jit
def _scale_of(amax, fmax):  # pragma: no cover - compiled
    """``_block_scale`` of a block whose largest finite magnitude is ``amax`` (float64)."""
    wanted = amax / fmax
    s = np.float32(wanted)
    if s < wanted:
        s = np.nextafter(s, np.float32(np.inf))
    if s < _MIN_SCALE:
        s = _MIN_SCALE
    if amax == 0:
        s = np.float32(1.0)
    return s


@_jit
def encode_scaled(src, scales, codes, fmt, fmax, block, wide):  # pragma: no cover - compiled
    """Per block of ``block`` elements of ``src`` (float32 or float64): its scale into
    ``scales``, then its codes (uint8 bytes; fp16 writes two per element), one block at a
    time. ``wide``: ``src`` is float64 (scaled in float64, else in float32)."""
    count = src.size
    nb = (count + block - 1) // block
    for b in range(nb):
        lo = b * block
        hi = min(lo + block, count)
        s = _block_scale(src, lo, hi, fmax)
        scales[b] = s
        if fmt == FP8:
            _fp8_block(src, codes, lo, hi, s, wide)
        elif fmt == INT8:
            _int8_block(src, codes, lo, hi, s, wide)
        else:
            _fp16_block(src, codes, lo, hi, s, wide, fmax)


@_jit
def _scaled(x, s, wide):  # pragma: no cover - compiled
    """``x / s`` as the numpy codec computes it: times the inverse, in float64 for float64
    input and float32 for float32 (widened to float64 exactly); NaN where ``s`` overflowed."""
    if s == np.inf:
        return np.nan
    if wide:
        return x * (1.0 / np.float64(s))
    return np.float64(np.float32(x) * (np.float32(1.0) / s))


@_jit
def _fp8_block(src, codes, lo, hi, s, wide):  # pragma: no cover - compiled
    for i in range(lo, hi):
        codes[i] = _e4m3_code(_scaled(src[i], s, wide))


@_jit
def _int8_block(src, codes, lo, hi, s, wide):  # pragma: no cover - compiled
    if s == np.inf:                          # float64 beyond float32's range: NaN codes
        for i in range(lo, hi):
            codes[i] = np.uint8(0x80)
        return
    inv64 = 1.0 / np.float64(s)
    inv32 = np.float32(1.0) / s
    for i in range(lo, hi):
        # the branches select (no jumps), so that the loop vectorises
        y = src[i] * inv64 if wide else np.float64(np.float32(src[i]) * inv32)
        q = min(max(np.rint(y), -127.0), 127.0)
        c = np.int64(q) & 0xFF if y - y == 0.0 else 0x80   # NaN code (inf too)
        codes[i] = np.uint8(c)


@_jit
def _fp16_block(src, codes, lo, hi, s, wide, fmax):  # pragma: no cover - compiled
    for i in range(lo, hi):
        y = _scaled(src[i], s, wide)
        if y - y == 0.0:                     # saturate finite values only
            y = min(max(y, -fmax), fmax)
        h = _half_bits(y)
        codes[2 * i] = np.uint8(h & np.uint16(0xFF))
        codes[2 * i + 1] = np.uint8(h >> np.uint16(8))


@_jit
def decode_scaled(scales, codes, out, fmt, table, block, add):  # pragma: no cover - compiled
    """``out`` (float64) = code value times its block's scale, the exact float64 product
    (``add``: ``out +=`` it, one rounding, the bits of decoding into a scratch array and
    adding it); float32 output goes to ``decode_scaled32``. ``table``: float32 value of each
    code (fp8, int8: 256, fp16: 65536 entries)."""
    count = out.size
    nb = (count + block - 1) // block
    for b in range(nb):
        s = np.float64(scales[b])
        lo = b * block
        hi = min(lo + block, count)
        if fmt == FP16:
            for i in range(lo, hi):
                h = np.int64(codes[2 * i]) | (np.int64(codes[2 * i + 1]) << 8)
                p = np.float64(table[h]) * s
                out[i] = out[i] + p if add else p
        else:
            for i in range(lo, hi):
                p = np.float64(table[codes[i]]) * s
                out[i] = out[i] + p if add else p


@_jit
def decode_add_bf16(codes, acc):  # pragma: no cover - compiled
    """``acc += decode(codes)``: one rounding of the sum in ``acc``'s dtype, as numpy's
    ``acc += part`` after ``decode_bf16`` into ``part`` (bfloat16 is exact in float32)."""
    for i in range(acc.size):
        acc[i] += np.uint32(np.uint32(codes[i]) << np.uint32(16)).view(np.float32)


# -- float32 input: branch-free loops that the compiler vectorises ---------------------------
# The general kernels above branch per element (non-finite values, binades), which keeps them
# scalar; float32, the common input, gets loops of selects and integer bit operations with
# the same results, bit for bit (tests/algorithms/test_compression.py compares every format).
_FINITE = np.uint32(0x7F800000)              # |x|'s bits at or above this: inf or NaN
_MAGNITUDE = np.uint32(0x7FFFFFFF)


@_jit
def _amax_bits(bits, lo, hi):  # pragma: no cover - compiled
    """The largest finite magnitude of a float32 block, from its bits: non-negative floats
    order as their bits do, so an integer max (which vectorises, unlike a float max without
    fastmath) finds it; inf and NaN count as zero."""
    m = np.uint32(0)
    block = bits[lo:hi]                      # indices from 0: the loop vectorises
    for i in range(block.size):
        a = block[i] & _MAGNITUDE
        a = a if a < _FINITE else np.uint32(0)
        m = a if a > m else m
    return np.float64(np.uint32(m).view(np.float32))


@_jit
def encode_scaled32(src, bits, scales, codes, fmt, fmax, block):  # pragma: no cover
    """``encode_scaled`` of float32 ``src`` (``bits``: the same memory as uint32): the
    block's scale from ``_amax_bits``, then its codes, one block at a time. ``codes``: one
    uint8 per element (fp8, int8), or one uint16 (fp16, in native byte order)."""
    count = src.size
    nb = (count + block - 1) // block
    for b in range(nb):
        lo = b * block
        hi = min(lo + block, count)
        s = _scale_of(_amax_bits(bits, lo, hi), fmax)
        scales[b] = s
        inv = np.float32(1.0) / s
        if fmt == FP8:
            _fp8_block32(src[lo:hi], codes[lo:hi], inv)
        elif fmt == INT8:
            _int8_block32(src[lo:hi], codes[lo:hi], inv)
        else:
            _fp16_block32(src[lo:hi], codes[lo:hi], inv)


@_jit
def _fp8_block32(src, codes, inv):  # pragma: no cover - compiled
    """e4m3fn codes of ``src[i] * inv`` (float32), as ``_e4m3_code``: normal values round
    their significand to 3 bits, nearest even, by adding to the bits (a carry moves into the
    exponent, as the next binade's code); below 2**-6 the code is the value in units of
    2**-9, rounded by adding 2**23 in float32; then saturation at 448 (0x7E), NaN and inf
    0x7F, the sign."""
    for i in range(src.size):
        y = np.float32(src[i] * inv)
        u = y.view(np.uint32)
        a = u & _MAGNITUDE
        sign = (u >> np.uint32(24)) & np.uint32(0x80)
        up = np.uint32(0x7FFFF) + ((a >> np.uint32(20)) & np.uint32(1))
        normal = np.int32((a + up) >> np.uint32(20)) - np.int32(960)   # (127 - 7) << 3
        small = np.float32(np.float32(abs(y) * np.float32(512.0)) + np.float32(8388608.0))
        sub = np.int32(np.float32(small).view(np.uint32) - np.uint32(0x4B000000))
        code = normal if a >= np.uint32(0x3C800000) else sub          # 2**-6
        code = min(code, np.int32(0x7E))
        code = np.int32(0x7F) if a >= _FINITE else code | np.int32(sign)
        codes[i] = np.uint8(code)


#: 65504, fp16's largest finite value (``Codec.fmax``), as float32 bits
_F16_MAX_BITS = np.uint32(0x477FE000)


@_jit
def _fp16_block32(src, codes, inv):  # pragma: no cover - compiled
    """binary16 bits of ``src[i] * inv`` (float32), as ``_fp16_block``: finite values
    saturate at 65504 (an integer min on the magnitude's bits: they order as the values
    do); normal halves round their significand to 10 bits, nearest even, by adding to the
    bits (a carry moves into the exponent); below 2**-14 the code is the value in units of
    2**-24, rounded by adding 2**23 in float32; inf 0x7C00, NaN 0x7C00 with the top of its
    payload; then the sign."""
    for i in range(src.size):
        y = np.float32(src[i] * inv)
        u = y.view(np.uint32)
        a = u & _MAGNITUDE
        sign = (u >> np.uint32(16)) & np.uint32(0x8000)
        m = np.uint32(min(a, _F16_MAX_BITS))
        up = np.uint32(np.uint32(0xFFF) + ((m >> np.uint32(13)) & np.uint32(1)))
        normal = np.uint32(((m + up) >> np.uint32(13)) - np.uint32(0x1C000))  # (127-15) << 10
        scaled = np.float32(m.view(np.float32) * np.float32(16777216.0))
        small = np.float32(scaled + np.float32(8388608.0))
        sub = np.uint32(small.view(np.uint32) - np.uint32(0x4B000000))
        code = normal if m >= np.uint32(0x38800000) else sub          # 2**-14
        payload = np.uint32((a >> np.uint32(13)) & np.uint32(0x3FF))
        nan = np.uint32(0x7C00) | (payload if payload != np.uint32(0) else np.uint32(1))
        code = code if a < _FINITE else (np.uint32(0x7C00) if a == _FINITE else nan)
        codes[i] = np.uint16(code | sign)


@_jit
def _int8_block32(src, codes, inv):  # pragma: no cover - compiled
    """int8 codes of ``src[i] * inv`` (float32), as ``_int8_block``: clamped to +-127 and
    rounded to nearest even by adding 1.5 * 2**23 in float32; NaN and inf -128."""
    for i in range(src.size):
        y = np.float32(src[i] * inv)
        finite = (y.view(np.uint32) & _MAGNITUDE) < _FINITE
        t = min(max(y, np.float32(-127.0)), np.float32(127.0)) if finite else np.float32(0.0)
        r = np.float32(t + np.float32(12582912.0)) - np.float32(12582912.0)
        codes[i] = np.uint8(np.int32(r) & np.int32(0xFF)) if finite else np.uint8(0x80)


@_jit
def decode_scaled32(scales, codes, out, fmt, table, block, add):  # pragma: no cover
    """``decode_scaled`` into float32, fp8 and int8: the
    float32 product of the code's value and the scale is the exact product rounded once, as
    the float64 product stored into float32 is, and the loops over a block's slices
    vectorise. The codes are converted, not looked up (``table`` is the float64 path's).
    ``codes``: uint8 (fp8, int8) or uint16 (fp16, native byte order). int8: the code itself,
    -128 NaN; fp8: ``_e4m3_value``; fp16: ``_half_value``."""
    count = out.size
    nb = (count + block - 1) // block
    for b in range(nb):
        s = scales[b]
        lo = b * block
        hi = min(lo + block, count)
        c = codes[lo:hi]
        o = out[lo:hi]
        if fmt == INT8:
            ints = c.view(np.int8)
            for i in range(ints.size):
                v = np.float32(ints[i]) if ints[i] != -128 else np.float32(np.nan)
                o[i] = o[i] + v * s if add else v * s
        elif fmt == FP8:
            for i in range(c.size):
                v = _e4m3_value(c[i])
                o[i] = o[i] + v * s if add else v * s
        else:
            for i in range(c.size):
                v = _half_value(c[i])
                o[i] = o[i] + v * s if add else v * s


@_jit
def _half_value(code):  # pragma: no cover - compiled
    """The float32 value of binary16 bits, as numpy's cast gives it (``compression._F16``'s
    entry, without the lookup): a normal code's exponent and significand shifted into
    float32's fields (bias 15 -> 127), a subnormal one its significand times 2**-24, inf
    and NaN (exponent field 31) float32's with the payload shifted along; then the sign."""
    h = np.uint32(code)
    mag = np.uint32(h & np.uint32(0x7FFF))
    normal = np.uint32((mag << np.uint32(13)) + np.uint32(112 << 23))
    special = np.uint32(np.uint32(0x7F800000) | ((mag & np.uint32(0x3FF)) << np.uint32(13)))
    tiny = np.float32(np.float32(mag) * np.float32(2.0 ** -24)).view(np.uint32)
    bits = normal if mag < np.uint32(0x7C00) else special
    bits = bits if mag >= np.uint32(0x400) else tiny
    return np.uint32(bits | ((h & np.uint32(0x8000)) << np.uint32(16))).view(np.float32)


@_jit
def _e4m3_value(code):  # pragma: no cover - compiled
    """The float32 value of an e4m3fn code from its bits (``compression._E4M3``'s entry,
    without the lookup, so that the loop vectorises): a normal code's exponent and
    significand shifted into float32's fields (bias 7 -> 127), a subnormal one (exponent
    field 0) its significand times 2**-9, 0x7F and 0xFF NaN."""
    mag = np.uint32(code) & np.uint32(0x7F)
    normal = np.uint32((mag << np.uint32(20)) + np.uint32(120 << 23)).view(np.float32)
    v = normal if mag >= np.uint32(8) else np.float32(mag) * np.float32(2.0 ** -9)
    v = -v if code & np.uint8(0x80) else v
    return np.float32(np.nan) if mag == np.uint32(0x7F) else v    # the table's NaN: positive
