"""Checksums of host buffers for the end-to-end integrity checks (docs/integrity.md).

Two kinds, because collectives do two kinds of things to data:

* **moves** (broadcast, allgather, alltoall, gather, scatter, send/recv) deliver bytes
  unchanged, so a checksum of what the source sent equals the checksum of what a receiver
  got. ``word_sum`` adds the buffer as little-endian 64-bit words modulo 2**64: any change
  confined to one word (every single flipped bit, any burst inside 8 aligned bytes) changes
  the sum, and it runs at memory speed (numpy's unsigned sum wraps silently). It is weaker
  than a CRC against several errors that cancel (the same bit flipped up in one word and
  down in another); zlib's CRC-32 runs about five times slower here (docs/integrity.md).
* **sums** (allreduce and reduce_scatter with sum, avg or premul_sum) change the data, but
  the sum over elements of the result equals the sum of the ranks' input sums: exactly for
  integers (modulo 2**bits, ``modular_sum``), within a rounding bound for floats
  (``chunk_sums``: sums and absolute sums per chunk, in float64, from which the bound is
  derived in ``pycoll.comm.integrity``).
"""
from __future__ import annotations

import numpy as np

from .reduction import _bf16_to_f32

MASK64 = (1 << 64) - 1

#: unit roundoff (half the machine epsilon) of each float dtype
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24,
                 "float64": 2.0 ** -53}


def as_bytes(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view (no copy)."""
    return arr.reshape(-1).view(np.uint8)


def word_sum(data: np.ndarray) -> int:
    """The bytes of ``data`` (uint8, 1-D) as little-endian 64-bit words, summed modulo
    2**64; a tail shorter than a word counts as one zero-padded word."""
    whole = len(data) // 8 * 8
    total = int(data[:whole].view("<u8").sum(dtype=np.uint64)) if whole else 0
    if whole < len(data):
        total += int.from_bytes(data[whole:].tobytes(), "little")
    return total & MASK64


def block_word_sums(arr: np.ndarray, bounds: list[tuple[int, int]]) -> list[int]:
    """``word_sum`` of each block ``arr[a:b]`` (element bounds) of a 1-D array."""
    data = as_bytes(arr)
    size = arr.itemsize
    return [word_sum(data[a * size:b * size]) for a, b in bounds]


def modular_sum(arr: np.ndarray) -> int:
    """The sum of an integer array's elements modulo 2**bits (bits of its dtype), as the
    unsigned pattern: what an integer sum reduction preserves exactly, whatever the order
    and however often it wraps."""
    bits = arr.dtype.itemsize * 8
    unsigned = arr.reshape(-1).view(f"<u{arr.dtype.itemsize}")
    return int(unsigned.sum(dtype=np.uint64)) & ((1 << bits) - 1)


def chunk_length(dtype: str, world_size: int) -> int:
    """Elements per chunk of the float sum check: the largest power of two (64 to 65536)
    whose rounding bound stays below 2**-8 of the chunk's mean magnitude (see
    docs/integrity.md): long chunks cost less to exchange, short ones catch smaller flips."""
    u = UNIT_ROUNDOFF[dtype]
    target = 2.0 ** -8 / (2 * (world_size + 1) * u)
    length = 64
    while length * 2 <= min(target, 65536):
        length *= 2
    return length


def as_float(arr: np.ndarray, dtype: str) -> np.ndarray:
    """The values of a float buffer in a numpy float dtype (bfloat16 travels as uint16)."""
    flat = arr.reshape(-1)
    return _bf16_to_f32(flat) if dtype == "bfloat16" else flat


def chunk_sums(values: np.ndarray, chunk: int, absolute: bool = True
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Per chunk of ``chunk`` elements (the last may be shorter): the float64 sum of the
    values and, with ``absolute``, an upper bound of the sum of their magnitudes.

    The signed sums accumulate in float64 (their rounding must stay far below the
    reduction's). The magnitudes only scale the bound: they accumulate in float32 for
    float16/float32 data (half the memory traffic of float64), a block of rows at a time through one
    small buffer, and are raised by their own worst-case rounding (``chunk`` roundings)."""
    n = len(values)
    whole = n // chunk * chunk
    k = -(-n // chunk)
    sums = np.empty(k, dtype=np.float64)
    mags = np.empty(k, dtype=np.float64) if absolute else None
    if whole:
        body = values[:whole].reshape(-1, chunk)
        sums[:whole // chunk] = body.sum(axis=1, dtype=np.float64)
        if mags is not None:
            _magnitudes(body, mags)
    if whole < n:
        tail = values[whole:]
        sums[-1] = tail.sum(dtype=np.float64)
        if mags is not None:
            mags[-1] = np.abs(tail).sum(dtype=np.float64)
    return sums, mags


def _magnitudes(rows: np.ndarray, out: np.ndarray) -> None:
    """``out[i]`` >= the sum of ``|rows[i]|`` (see ``chunk_sums``)."""
    wide = rows.dtype == np.float64
    acc = np.float64 if wide else np.float32
    per_block = max(1, (1 << 18) // rows.shape[1])
    scratch = np.empty((min(per_block, len(rows)), rows.shape[1]), dtype=rows.dtype)
    for i in range(0, len(rows), per_block):
        block = rows[i:i + per_block]
        part = scratch[:len(block)]
        np.abs(block, out=part)
        out[i:i + len(block)] = part.sum(axis=1, dtype=acc)
    if not wide:
        out *= 1.0 + rows.shape[1] * 2.0 ** -23
