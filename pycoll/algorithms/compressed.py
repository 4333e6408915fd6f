"""Compressed collectives (``compress=``): the bytes on the wire are a smaller format, the
arithmetic is not.

Every value that travels is quantised once, by the rank that sends it, in blocks on a grid
that starts at the piece's first element (``buffers/compression.py``: bf16, fp16, fp8 e4m3,
int8 with per-block float32 scales); every rank that receives it decodes the same bytes to the
same bits and accumulates in float32 (float64 for float64 buffers).

* **allreduce**: each chunk's owner (chunks of whole blocks, one per rank) receives every
  rank's quantised piece of it, decodes them and folds them in rank order in the accumulation
  dtype, applies avg's scale, and quantises the result once; it sends those bytes to every
  other rank, and every rank, the owner too, decodes its result from them. Both halves are
  pipelined in pieces of ``PIECE`` elements (``fold_owned``), so the codec passes overlap the
  transfer instead of adding to it. Each element is
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

from ..buffers.compression import BLOCK, Compression, aligned_bounds, from_acc, to_acc
from ..transports.base import Request
from .cost import PER_MESSAGE_US, Algorithm, Network, alpha, bound, gamma, lg, pof2
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


#: input elements per pipelined piece (whole blocks, 1 MiB of float32): a piece's codec pass
#: is short next to its transfer, so the first piece's encode and the last one's decode are
#: all that does not overlap the wire; and long next to the few Python calls each piece costs
PIECE = 1024 * BLOCK

#: (lo, hi, a, b): a piece's elements in the buffer and its bytes in the wire buffer
Piece = tuple[int, int, int, int]


def _plan(comp: Compression, bounds: Bounds) -> list[list[Piece]]:
    """Every chunk's pieces (``PIECE`` elements from the chunk's start, so they start on the
    block grid and encode exactly the blocks the whole chunk does; one empty piece for an
    empty chunk) with their byte ranges in a buffer of every chunk's encoding, in order."""
    out: list[list[Piece]] = []
    start = 0
    for lo, hi in bounds:
        pieces = []
        for plo in range(lo, hi, PIECE) if hi > lo else (lo,):
            phi = min(plo + PIECE, hi)
            size = comp.codec.wire_nbytes(phi - plo)
            pieces.append((plo, phi, start, start + size))
            start += size
        out.append(pieces)
    return out


class _Results:
    """The allreduce's second half, fed piece by piece by ``fold_owned``: the owner encodes
    each folded piece of its chunk once, sends the bytes to every other rank and decodes them
    into its own buffer; the other owners' pieces are decoded as they arrive (between folds,
    so that decoding overlaps the transfer too)."""

    def __init__(self, peers: Peers, comp: Compression, arr: np.ndarray,
                 plan: list[list[Piece]]) -> None:
        self.peers, self.comp, self.arr, self.plan = peers, comp, arr, plan
        self.wire = peers.scratch(plan[-1][-1][3], np.dtype(np.uint8), slot=_WIRE)
        self.sends: list[Request] = []
        self.arriving: list[tuple[Piece, Request]] = []

    def post(self, others: list[int]) -> None:
        """The receives of every other owner's result pieces: posted after that owner's fold
        receives, as it sends its result pieces after all its fold pieces (one tag, in
        order)."""
        for q in others:
            for piece in self.plan[q]:
                self.arriving.append((piece, self.peers.irecv(q, self.wire[piece[2]:piece[3]])))

    def folded(self, j: int, acc: np.ndarray, others: list[int]) -> None:
        lo, hi, a, b = self.plan[self.peers.rank][j]
        self.comp.codec.encode(acc, self.wire[a:b])     # the result, quantised once
        self.sends += [self.peers.isend(q, self.wire[a:b]) for q in others]
        _decode(self.peers, self.comp, self.wire[a:b], self.arr[lo:hi])
        self.drain(False)

    def drain(self, block: bool) -> None:
        """Decode the arrived result pieces (all of them, waiting for each, if ``block``)."""
        left = self.arriving
        i = 0
        while i < len(left) and (block or left[i][1].done):
            (lo, hi, a, b), req = left[i]
            self.peers.wait([req])
            _decode(self.peers, self.comp, self.wire[a:b], self.arr[lo:hi])
            i += 1
        del left[:i]
        if block:
            self.peers.wait(self.sends)


def fold_owned(peers: Peers, arr: np.ndarray, bounds: Bounds, comp: Compression,
               results: _Results | None = None) -> np.ndarray:
    """Send every other owner this rank's quantised piece of its chunk (``bounds``), receive
    every rank's piece of this rank's chunk, and fold them, decoded, in rank order in the
    accumulation dtype (this rank's own piece quantised like the others, so that the result
    does not depend on who owns what); avg's scale applied. Returns the accumulator.

    Pipelined: each chunk travels as pieces of ``PIECE`` elements; every piece is encoded and
    sent at once (a progress pass after each round, so the sockets are fed while the next
    pieces encode), and the owner folds piece j while later pieces are still on the wire,
    handing each folded piece to ``results`` (the allreduce's second half). The arithmetic
    is element by element, so the bits do not depend on the piece size."""
    n, r = peers.size, peers.rank
    plan = _plan(comp, bounds)
    sendbuf = peers.scratch(plan[-1][-1][3], np.dtype(np.uint8), slot=_SEND)
    mine = plan[r]
    first = mine[0][2]
    size = mine[-1][3] - first
    others = [(r + step) % n for step in range(1, n)]
    space = peers.scratch(max(1, (n - 1) * size), np.dtype(np.uint8), slot=_RECV)
    at = {q: i * size - first for i, q in enumerate(others)}

    def piece_of(q: int, piece: Piece) -> np.ndarray:
        """Rank q's encoding of ``piece`` of this rank's chunk."""
        if q == r:
            return sendbuf[piece[2]:piece[3]]
        return space[at[q] + piece[2]:at[q] + piece[3]]

    arrivals = [[peers.irecv(q, piece_of(q, piece)) for q in others] for piece in mine]
    if results is not None:
        results.post(others)
    sends: list[Request] = []
    for j in range(max(len(pieces) for pieces in plan)):
        for q in others + [r]:           # every owner's piece j, then the next round
            if j < len(plan[q]):
                lo, hi, a, b = plan[q][j]
                _encode(peers, comp, arr[lo:hi], sendbuf[a:b])
                if q != r:
                    sends.append(peers.isend(q, sendbuf[a:b]))
        peers.poke()
    base = bounds[r][0]
    acc = peers.scratch(bounds[r][1] - base, comp.acc, slot=_ACC)
    for j, piece in enumerate(mine):
        peers.wait(arrivals[j])
        part = acc[piece[0] - base:piece[1] - base]
        comp.codec.decode(piece_of(0, piece), part)
        for q in range(1, n):
            comp.codec.decode_add(piece_of(q, piece), part)
        comp.finish(part)
        if results is not None:
            results.folded(j, part, others)
        peers.poke()
    peers.wait(sends)
    return acc


def allreduce_compressed(peers: Peers, arr: np.ndarray, spec: ReduceSpec,
                         comp: Compression) -> None:
    """The owners' fold, each folded piece quantised once by its owner and sent to every
    other rank at once (the bytes of a ring's allgather, overlapped with the fold)."""
    bounds = aligned_bounds(arr.size, peers.size)
    results = _Results(peers, comp, arr, _plan(comp, bounds))
    fold_owned(peers, arr, bounds, comp, results)
    results.drain(True)


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


# -- costs: ``nbytes`` is the uncompressed size; ``net.wire`` says how much of it travels ----
#: the fixed cost of one codec pass (a call into the kernel, its views)
CODEC_CALL_US = 30.0


def codec_time(nbytes: float, net: Network, calls: int = 1) -> float:
    """``calls`` (de)quantisation passes over ``nbytes`` input bytes in all, at the
    format's codec speed (``Network.wire``)."""
    return calls * CODEC_CALL_US * 1e-6 + nbytes / (net.wire.codec_gbps * 1e9)


def _wire(nbytes: int, net: Network) -> float:
    return nbytes * net.wire.ratio


def _fold_time(nbytes: int, p: int, net: Network, wire: float) -> float:
    """The owners' round: every rank encodes its p pieces (the whole buffer), p - 1 pieces
    arrive at once over the owner's link, and it decodes and folds p pieces of 1/p."""
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    return (a + (p - 2) * PER_MESSAGE_US * 1e-6 + (p - 1) / p * wire * b
            + 2 * codec_time(nbytes, net, p) + nbytes * g)


def _rounds(p: int) -> int:
    """The allgather's rounds: recursive doubling where p is a power of two, else a ring."""
    return lg(p) if p > 2 and pof2(p) == p else p - 1


def _allreduce_cost(nbytes: int, p: int, net: Network) -> float:
    """Pipelined (``fold_owned``): the codec passes (every rank encodes the whole buffer,
    folds p pieces of 1/p, encodes 1/p, decodes the whole) overlap the transfer of both
    halves over the rank's link, so the longer of the two counts, plus what cannot overlap:
    the first piece's encode and the last one's fold, encode and decode."""
    link = net.link
    wire = _wire(nbytes, net)
    piece = min(nbytes / p, 4.0 * PIECE)
    transfer = 2 * (p - 1) / p * wire * link.beta
    codec = codec_time((3 + 1 / p) * nbytes, net, 3 * p + 1)
    critical = (2 * alpha(p, link, True) + 2 * (p - 2) * PER_MESSAGE_US * 1e-6
                + max(transfer, codec) + codec_time(4 * piece, net) + nbytes / p * gamma())
    work = p * ((p - 1) / p * wire * 2 * link.beta + codec_time(3 * nbytes, net, 3 * p + 1)
                + nbytes * gamma())
    return bound(critical, work, p, link)


def _reduce_scatter_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    wire = _wire(nbytes, net)
    work = p * ((p - 1) / p * wire * link.beta + codec_time(2 * nbytes, net, 2 * p))
    return bound(_fold_time(nbytes, p, net, wire), work, p, link)


def _allgather_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    wire = _wire(nbytes, net)
    critical = (_rounds(p) * alpha(p, link, True) + (p - 1) / p * wire * link.beta
                + codec_time(nbytes / p, net) + codec_time(nbytes, net, p))
    return bound(critical, (p - 1) * wire * link.beta + p * codec_time(nbytes, net, p + 1), p,
                 link)


def _broadcast_cost(nbytes: int, p: int, net: Network) -> float:
    link = net.link
    wire = _wire(nbytes, net)
    critical = (lg(p) * (alpha(p, link, False) + wire * link.beta)
                + codec_time(2 * nbytes, net, 2))
    return bound(critical, (p - 1) * wire * link.beta + p * codec_time(nbytes, net), p, link,
                 False)


ALLREDUCE = Algorithm("allreduce", "compressed", allreduce_compressed, _allreduce_cost,
                      compressed=True)
REDUCE_SCATTER = Algorithm("reduce_scatter", "compressed", reduce_scatter_compressed,
                           _reduce_scatter_cost, compressed=True)
ALLGATHER = Algorithm("allgather", "compressed", allgather_compressed, _allgather_cost,
                      compressed=True)
BROADCAST = Algorithm("broadcast", "compressed", broadcast_compressed, _broadcast_cost,
                      compressed=True)
