"""Compressed collectives (``compress=``): the bytes on the wire are a smaller format, the
arithmetic is not.

Every value that travels is quantised once, by the rank that sends it, in blocks on a grid
that starts at the piece's first element (``buffers/compression.py``: bf16, fp16, fp8 e4m3,
int8 with per-block float32 scales); every rank that receives it decodes the same bytes to the
same bits and accumulates in float32 (float64 for float64 buffers).

* **allreduce**: each chunk's owner (chunks of whole blocks, one per rank) receives every
  rank's quantised piece of it, decodes them and folds them in rank order in the accumulation
  dtype, applies avg's scale, and quantises the result once; an allgather of those bytes
  follows, and every rank, the owner too, decodes its result from them. Each element is
  quantised twice whatever the world size (its input, then the owner's sum), so the error
  does not grow with the number of steps as a ring's re-quantised partial sums would; the
  bytes each rank sends and receives are a ring's, 2 (p - 1) / p of the wire size. Since the
  fold is in rank order and the blocks follow the buffer, the result is a function of the
  inputs and the world size only: ``deterministic=True`` holds by construction.
* **reduce_scatter**: the same owner's fold; the owner keeps its result (nothing to send, so
  no second quantisation).
* **allgather** / **broadcast**: the owner (root) quantises its block once; every rank, the
  owner too, decodes the bytes that travelled.

Each run function takes the ``Compression`` (format, dtype, finishing step) after the usual
arguments (``__init__.py``).
"""
from __future__ import annotations

import numpy as np

from ..buffers.compression import Compression, aligned_bounds, from_acc, to_acc
from ..transports.base import Request
from .cost import PER_MESSAGE_US, Algorithm, LinkModel, Network, alpha, bound, gamma, lg, pof2
from .halving_doubling import allgather_recursive_doubling
from .primitives import Peers, ReduceSpec
from .ring import allgather_ring
from .tree import broadcast_binomial

#: the scratch slots of compressed calls (the primitives and the ordered fold use 0-3)
_WIRE, _SEND, _RECV, _ACC, _PART = 4, 5, 6, 7, 8

Bounds = list[tuple[int, int]]


def _layout(comp: Compression, bounds: Bounds) -> Bounds:
    """The byte range of each piece's encoding in a buffer of all of them, in order."""
    out, start = [], 0
    for lo, hi in bounds:
        size = comp.codec.wire_nbytes(hi - lo)
        out.append((start, start + size))
        start += size
    return out


def _encode(peers: Peers, comp: Compression, src: np.ndarray, out: np.ndarray) -> None:
    """Quantise ``src`` (the buffer's dtype) into ``out``; halves are widened first."""
    if comp.dtype in ("float16", "bfloat16"):
        wide = peers.scratch(src.size, comp.acc, slot=_PART)
        to_acc(src, comp.dtype, wide)
        src = wide
    comp.codec.encode(src, out)


def _decode(peers: Peers, comp: Compression, wire: np.ndarray, out: np.ndarray) -> None:
    """Decode ``wire`` into ``out`` (the buffer's dtype: rounded once for halves)."""
    if out.dtype == comp.acc:
        comp.codec.decode(wire, out)
        return
    wide = peers.scratch(out.size, comp.acc, slot=_PART)
    comp.codec.decode(wire, wide)
    from_acc(wide, comp.dtype, out)


def _gather_bytes(peers: Peers, wire: np.ndarray, layout: Bounds) -> None:
    """Every rank's encoded piece (``layout``) to every rank: recursive doubling where the
    world is a power of two (lg p rounds), a ring otherwise (the same bytes)."""
    n = peers.size
    if n > 2 and not n & (n - 1):
        allgather_recursive_doubling(peers, wire, layout)
    else:
        allgather_ring(peers, wire, bounds=layout)


def fold_owned(peers: Peers, arr: np.ndarray, bounds: Bounds, comp: Compression) -> np.ndarray:
    """Send every other owner this rank's quantised piece of its chunk (``bounds``), receive
    every rank's piece of this rank's chunk, and fold them, decoded, in rank order in the
    accumulation dtype (this rank's own piece quantised like the others, so that the result
    does not depend on who owns what); avg's scale applied. Returns the accumulator."""
    n, r = peers.size, peers.rank
    layout = _layout(comp, bounds)
    sendbuf = peers.scratch(layout[-1][1], np.dtype(np.uint8), slot=_SEND)
    sends: list[Request] = []
    for step in range(1, n + 1):             # the others' first, in the order they fold
        q = (r + step) % n
        lo, hi = bounds[q]
        a, b = layout[q]
        _encode(peers, comp, arr[lo:hi], sendbuf[a:b])
        if q != r:
            sends.append(peers.isend(q, sendbuf[a:b]))
    lo, hi = bounds[r]
    a, b = layout[r]
    size = b - a
    space = peers.scratch(max(1, (n - 1) * size), np.dtype(np.uint8), slot=_RECV)
    others = [q for q in range(n) if q != r]
    pieces = {q: space[i * size:(i + 1) * size] for i, q in enumerate(others)}
    pieces[r] = sendbuf[a:b]
    peers.wait([peers.irecv(q, pieces[q]) for q in others])
    acc = peers.scratch(hi - lo, comp.acc, slot=_ACC)
    part = peers.scratch(hi - lo, comp.acc, slot=_PART)
    comp.codec.decode(pieces[0], acc)
    for q in range(1, n):
        comp.codec.decode(pieces[q], part)
        acc += part
    comp.finish(acc)
    peers.wait(sends)
    return acc


def allreduce_compressed(peers: Peers, arr: np.ndarray, spec: ReduceSpec,
                         comp: Compression) -> None:
    n, r = peers.size, peers.rank
    bounds = aligned_bounds(arr.size, n)
    acc = fold_owned(peers, arr, bounds, comp)
    layout = _layout(comp, bounds)
    wire = peers.scratch(layout[-1][1], np.dtype(np.uint8), slot=_WIRE)
    comp.codec.encode(acc, wire[layout[r][0]:layout[r][1]])     # the result, quantised once
    _gather_bytes(peers, wire, layout)
    for (lo, hi), (a, b) in zip(bounds, layout):
        _decode(peers, comp, wire[a:b], arr[lo:hi])


def reduce_scatter_compressed(peers: Peers, work: np.ndarray, spec: ReduceSpec,
                              comp: Compression) -> None:
    """Rank r ends with block r of ``work`` (its output): the owner's fold, kept."""
    n, r = peers.size, peers.rank
    count = work.size // n
    bounds = [(q * count, (q + 1) * count) for q in range(n)]
    acc = fold_owned(peers, work, bounds, comp)
    from_acc(acc, comp.dtype, work[r * count:(r + 1) * count])


def allgather_compressed(peers: Peers, out: np.ndarray, bounds: Bounds,
                         comp: Compression) -> None:
    """Own block already in ``out``: quantised once here, decoded everywhere (here too)."""
    r = peers.rank
    layout = _layout(comp, bounds)
    wire = peers.scratch(layout[-1][1], np.dtype(np.uint8), slot=_WIRE)
    lo, hi = bounds[r]
    _encode(peers, comp, out[lo:hi], wire[layout[r][0]:layout[r][1]])
    _gather_bytes(peers, wire, layout)
    for (lo, hi), (a, b) in zip(bounds, layout):
        _decode(peers, comp, wire[a:b], out[lo:hi])


def broadcast_compressed(peers: Peers, arr: np.ndarray, root: int, comp: Compression) -> None:
    """The root quantises, a binomial tree carries the bytes, every rank (the root too)
    decodes them into ``arr``."""
    wire = peers.scratch(comp.codec.wire_nbytes(arr.size), np.dtype(np.uint8), slot=_WIRE)
    if peers.rank == root:
        _encode(peers, comp, arr, wire)
    broadcast_binomial(peers, wire, root)
    _decode(peers, comp, wire, arr)


# -- costs: ``nbytes`` is the uncompressed size; the network says how much of it travels -----
#: input bytes per second of one quantisation or dequantisation pass (numpy, several
#: temporaries per element), and the fixed cost of one pass (a dozen numpy calls): both to
#: calibrate with ``python -m pycoll.bench allreduce --compress`` on an idle machine
CODEC_GBPS = 1.0
CODEC_CALL_US = 30.0


def codec_time(nbytes: float, calls: int = 1) -> float:
    """``calls`` (de)quantisation passes over ``nbytes`` input bytes in all."""
    return calls * CODEC_CALL_US * 1e-6 + nbytes / (CODEC_GBPS * 1e9)


def _wire(nbytes: int, net: Network) -> float:
    return nbytes * net.wire_ratio


def _fold_time(nbytes: int, p: int, link: LinkModel, wire: float) -> float:
    """The owners' round: every rank encodes its p pieces (the whole buffer), p - 1 pieces
    arrive at once over the owner's link, and it decodes and folds p pieces of 1/p."""
    a, b, g = alpha(p, link, True), link.beta, gamma()
    return (a + (p - 2) * PER_MESSAGE_US * 1e-6 + (p - 1) / p * wire * b
            + 2 * codec_time(nbytes, p) + nbytes * g)


def _rounds(p: int) -> int:
    """The allgather's rounds: recursive doubling where p is a power of two, else a ring."""
    return lg(p) if p > 2 and pof2(p) == p else p - 1


def _allreduce_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    wire = _wire(nbytes, net)
    ag = _rounds(p) * alpha(p, link, True) + (p - 1) / p * wire * link.beta
    critical = (_fold_time(nbytes, p, link, wire) + codec_time(nbytes / p) + ag
                + codec_time(nbytes, p))
    work = p * ((p - 1) / p * wire * 2 * link.beta + codec_time(3 * nbytes, 3 * p + 1)
                + nbytes * gamma())
    return bound(critical, work, p, link)


def _reduce_scatter_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    wire = _wire(nbytes, net)
    work = p * ((p - 1) / p * wire * link.beta + codec_time(2 * nbytes, 2 * p))
    return bound(_fold_time(nbytes, p, link, wire), work, p, link)


def _allgather_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    wire = _wire(nbytes, net)
    critical = (_rounds(p) * alpha(p, link, True) + (p - 1) / p * wire * link.beta
                + codec_time(nbytes / p) + codec_time(nbytes, p))
    return bound(critical, (p - 1) * wire * link.beta + p * codec_time(nbytes, p + 1), p,
                 link)


def _broadcast_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    wire = _wire(nbytes, net)
    critical = lg(p) * (alpha(p, link, False) + wire * link.beta) + codec_time(2 * nbytes, 2)
    return bound(critical, (p - 1) * wire * link.beta + p * codec_time(nbytes), p, link,
                 False)


ALLREDUCE = Algorithm("allreduce", "compressed", allreduce_compressed, _allreduce_cost,
                      compressed=True)
REDUCE_SCATTER = Algorithm("reduce_scatter", "compressed", reduce_scatter_compressed,
                           _reduce_scatter_cost, compressed=True)
ALLGATHER = Algorithm("allgather", "compressed", allgather_compressed, _allgather_cost,
                      compressed=True)
BROADCAST = Algorithm("broadcast", "compressed", broadcast_compressed, _broadcast_cost,
                      compressed=True)
