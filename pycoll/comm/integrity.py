"""End-to-end integrity checks of collectives: ``integrity=True``, ``PYCOLL_INTEGRITY``.

A checked call computes small checksums of its inputs before the algorithm runs and of its
outputs after it, then exchanges them inside the same call (one small allgather of every
rank's summary, on the call's own tag), so every rank holds the same numbers and reaches the
same verdict. The verdict is raised as ``DataCorruption`` only after the call completed on
this rank (``Execution.execute``'s ``then``): the communicator is not failed, because its
ranks are still in step; only the data of this call is wrong.

What is checked, and why each way (docs/integrity.md has the derivations):

* moves (broadcast, allgather, alltoall, gather, scatter, send/recv): a word sum of every
  block at its source and at each receiver (``MoveCheck``); exact, and the block that
  differs names the link (source, receiver);
* sums (allreduce, reduce, reduce_scatter, allreduce_coalesced with sum, avg, premul_sum):
  per chunk, the sum of the result against the sum of the ranks' input sums, within a
  rounding bound for floats and exactly (modulo 2**bits) for integers (``SumCheck``); the
  ranks whose result fails are the suspects, all of them when the reduction itself went
  wrong; where only some ranks hold a result (reduce's root, reduce_scatter's blocks), they
  alone are judged, against every rank's input of the same elements;
* every exact reduction (integers, min/max, bitwise) leaves the same bits on every rank: a
  rank whose result's word sum differs from the others' is suspect; min and max also check
  locally that the result is not below (above) this rank's own input (all that reduce and
  reduce_scatter can check of them: one copy of each result);
* ops with nothing to compare (float prod; for reduce and reduce_scatter also bitwise ops
  and integer prod and avg), batch_p2p: ``integrity=True`` is refused, a sampled call runs
  unchecked (``sum_check``, ``refuse``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..algorithms import ALGORITHMS
from ..algorithms.primitives import Peers
from ..buffers import checksums
from ..buffers.reduction import ReduceOp
from ..envvars import env_sampling
from ..errors import DataCorruption, InvalidArgument

_INTEGER_KINDS = "iu"
_EXACT_OPS = ("min", "max", "band", "bor", "bxor")


def sample_every() -> int:
    """``PYCOLL_INTEGRITY``: 0 (unset or ``off``: no call is checked unless asked), 1 (``on``
    or ``sample:1``: every call) or N (``sample:N``: every N-th collective of each
    communicator, by sequence number, so the same calls on every rank)."""
    return env_sampling("PYCOLL_INTEGRITY")


def exchange(peers: Peers, mine: np.ndarray) -> np.ndarray:
    """Every rank's ``mine`` (uint64, the same length everywhere), as rows in rank order:
    one allgather on the running call's tag, after its own messages."""
    n, size = len(mine), peers.size
    table = np.zeros(n * size, dtype=np.uint64)
    table[peers.rank * n:(peers.rank + 1) * n] = mine
    if size > 1 and n:
        ALGORITHMS["allgather"]["recursive_doubling"].run(
            peers, table, [(i * n, (i + 1) * n) for i in range(size)])
    return table.reshape(size, n)


class Check:
    """One checked call: what it found, raised by ``verdict`` once the call completed."""

    def __init__(self, rank: int, size: int, collective: str) -> None:
        self.rank = rank
        self.size = size
        self.collective = collective
        self.findings: list[str] = []
        self.suspects: set[int] = set()
        self.links: set[tuple[int, int]] = set()
        self.reduction_suspect = False
        #: the suspects hold the only copy of a reduced result (reduce, reduce_scatter)
        self.reduced_into = False

    def verdict(self, seq: int) -> None:
        """Raise ``DataCorruption`` if anything was found (every rank found the same)."""
        if not self.findings:
            return
        if self.links:
            who = "the link(s) " + ", ".join(f"rank {s} -> rank {d}"
                                             for s, d in sorted(self.links))
            who += (" (or the receiving rank's memory; where blocks are forwarded, by a "
                    "tree or ring, the first receiver in forwarding order corrupted it and "
                    "the others copied it)")
        elif self.suspects and self.reduced_into:
            who = (f"the reduction into rank(s) {sorted(self.suspects)}, which hold(s) the "
                   "wrong result: a partial result on its way there (a link or a rank's "
                   "memory on the path; the check does not know the algorithm's schedule)")
        elif self.suspects:
            who = (f"the result on rank(s) {sorted(self.suspects)} (the links into them, or "
                   "their memory)")
        else:
            who = ("the reduction itself: every rank got the same wrong result, so a partial "
                   "result was corrupted in transit or while being reduced, before it was "
                   "distributed")
        shown = self.findings[:4]
        more = f" (and {len(self.findings) - 4} more)" if len(self.findings) > 4 else ""
        raise DataCorruption(
            f"rank {self.rank}: {self.collective} #{seq}: data corruption detected by the "
            f"integrity check: {'; '.join(shown)}{more}. Suspect: {who}. The result of this "
            "call is wrong; the communicator is still usable. What to do: rerun the step; if "
            "it repeats on the same rank or link, check that host's memory (ECC counters, "
            "dmesg), NIC and cabling, and report it with this message (docs/integrity.md)",
            collective=self.collective, seq=seq, suspects=sorted(self.suspects),
            links=sorted(self.links), where="; ".join(self.findings))


class CheckGroup(Check):
    """Several checks of one call, one verdict (allreduce_coalesced: one per dtype group)."""

    def __init__(self, rank: int, size: int, collective: str, parts: Sequence[Check]) -> None:
        super().__init__(rank, size, collective)
        self.parts = list(parts)

    def verdict(self, seq: int) -> None:
        for part in self.parts:
            self.findings += part.findings
            self.suspects |= part.suspects
            self.links |= part.links
            self.reduction_suspect |= part.reduction_suspect
            self.reduced_into |= part.reduced_into
        super().verdict(seq)


class MoveCheck(Check):
    """Blocks moved unchanged: the word sum of block (source -> receiver) where it was sent
    and where it arrived must agree."""

    def __init__(self, rank: int, size: int, collective: str) -> None:
        super().__init__(rank, size, collective)
        self._summary = np.zeros(4 * size, dtype=np.uint64)  # sent?, sent, got?, got

    def sent(self, dst: int, block: np.ndarray) -> None:
        """This rank sends ``block`` (its bytes as they are now) to ``dst``."""
        self._summary[dst] = 1
        self._summary[self.size + dst] = checksums.word_sum(checksums.as_bytes(block))

    def sent_to_all(self, block: np.ndarray, others: Sequence[int] | None = None) -> None:
        value = checksums.word_sum(checksums.as_bytes(block))
        for dst in range(self.size) if others is None else others:
            self._summary[dst] = 1
            self._summary[self.size + dst] = value

    def sent_blocks(self, arr: np.ndarray, bounds: Sequence[tuple[int, int]]) -> None:
        """Block i (element bounds ``bounds[i]`` of ``arr`` flattened) goes to rank i."""
        flat = arr.reshape(-1)
        for dst, (a, b) in enumerate(bounds):
            self.sent(dst, flat[a:b])

    def got_blocks(self, arr: np.ndarray, bounds: Sequence[tuple[int, int]]) -> None:
        """Block i (element bounds ``bounds[i]`` of ``arr`` flattened) came from rank i."""
        flat = arr.reshape(-1)
        for src, (a, b) in enumerate(bounds):
            self.got(src, flat[a:b])

    def got(self, src: int, block: np.ndarray) -> None:
        """This rank's copy of the block that ``src`` sent it, as it is after the call."""
        self._summary[2 * self.size + src] = 1
        self._summary[3 * self.size + src] = checksums.word_sum(checksums.as_bytes(block))

    def finish(self, peers: Peers) -> None:
        p = self.size
        table = exchange(peers, self._summary)
        for src in range(p):
            for dst in range(p):
                if table[src, dst] and table[dst, 2 * p + src]:
                    sent, got = int(table[src, p + dst]), int(table[dst, 3 * p + src])
                    if sent != got:
                        self.links.add((src, dst))
                        self.suspects.add(dst)
                        self.findings.append(f"the block rank {src} sent to rank {dst} has "
                                             f"checksum {sent:#018x} at rank {src} and "
                                             f"{got:#018x} at rank {dst}")


class SumCheck(Check):
    """A reduction's result against its inputs (see the module docstring): ``before`` on
    the input (after premul_sum's scaling), ``after`` on the result, then ``finish``.

    Who holds which result: every rank all of it (allreduce), the root all of it
    (``root=``: reduce), or rank r block r of ``count`` elements (``blocks=True``:
    reduce_scatter). The elements are cut into regions held alike (one region, or one per
    block), and the float chunks into pieces of those regions, so that no chunk crosses a
    block: each chunk's result sum is taken by the rank that holds it and compared with the
    ranks' input sums of the same elements."""

    def __init__(self, rank: int, size: int, collective: str, op: ReduceOp, dtype: str,
                 count: int, *, root: int | None = None, blocks: bool = False) -> None:
        super().__init__(rank, size, collective)
        self.op = op.name
        self.dtype = dtype
        self.count = count
        self.integer = dtype != "bfloat16" and np.dtype(dtype).kind in _INTEGER_KINDS
        self.float_sum = not self.integer and self.op in ("sum", "avg", "premul_sum") \
            and dtype in checksums.UNIT_ROUNDOFF
        self.int_sum = self.integer and self.op == "sum"
        # exact results are the same bits on every rank: compare the copies (an integer
        # sum's own check says exactly which results are wrong; a majority vote would blame
        # the correct ranks when a corrupted block was forwarded to most of them). Only
        # allreduce leaves copies to compare.
        self.copies = (root is None and not blocks and not self.int_sum
                       and (self.integer or self.op in _EXACT_OPS))
        block = count // size if blocks else count
        self._regions = ([(r * block, (r + 1) * block) for r in range(size)] if blocks
                         else [(0, count)])
        self._holders = ([[r] for r in range(size)] if blocks
                         else [list(range(size)) if root is None else [root]])
        #: the region this rank holds a result of (None: none, a reduce's other ranks)
        self._mine = next((g for g, h in enumerate(self._holders) if rank in h), None)
        self.chunk = checksums.chunk_length(dtype, size) if self.float_sum else 0
        # chunk index where each region's chunks start (the last entry: the total)
        self._first = [0]
        for a, b in self._regions:
            self._first.append(self._first[-1] + (-(-(b - a) // self.chunk)
                                                  if self.float_sum else 0))
        k, regions = self._first[-1], len(self._regions)
        # summary: [input sums, input magnitudes, result sums] per chunk (float64 bits),
        # then the integer input and result sums per region, the result's word sum, min/max
        # violations
        self._k = k
        self._tail = 3 * k + 2 * regions
        self._summary = np.zeros(self._tail + 2, dtype=np.uint64)
        self._input: np.ndarray | None = None

    def before(self, arr: np.ndarray) -> None:
        """This rank's input: all ``count`` elements (every rank contributes to all)."""
        s, k = self._summary, self._k
        flat = arr.reshape(-1)
        for g, (a, b) in enumerate(self._regions):
            if self.float_sum:
                sums, mags = checksums.chunk_sums(checksums.as_float(flat[a:b], self.dtype),
                                                  self.chunk)
                c0, c1 = self._first[g], self._first[g + 1]
                s[c0:c1] = sums.view(np.uint64)
                s[k + c0:k + c1] = mags.view(np.uint64)  # type: ignore[union-attr]
            elif self.int_sum:
                s[3 * k + g] = checksums.modular_sum(flat[a:b])
        if self.op in ("min", "max") and self._mine is not None:
            a, b = self._regions[self._mine]
            self._input = flat[a:b].copy()

    def after(self, arr: np.ndarray) -> None:
        """The result this rank holds (its region's elements only; nothing on a reduce's
        other ranks, which do not call it)."""
        if self._mine is None:
            return
        s, k, g = self._summary, self._k, self._mine
        flat = arr.reshape(-1)
        if self.float_sum:
            sums, _ = checksums.chunk_sums(checksums.as_float(flat, self.dtype), self.chunk,
                                           absolute=False)
            s[2 * k + self._first[g]:2 * k + self._first[g + 1]] = sums.view(np.uint64)
        elif self.int_sum:
            s[3 * k + len(self._regions) + g] = checksums.modular_sum(flat)
        if self.copies:
            s[self._tail] = checksums.word_sum(checksums.as_bytes(flat))
        if self._input is not None:
            values = checksums.as_float(flat, self.dtype) if self.dtype == "bfloat16" else flat
            mine = (checksums.as_float(self._input, self.dtype)
                    if self.dtype == "bfloat16" else self._input)
            wrong = values < mine if self.op == "max" else values > mine
            s[self._tail + 1] = np.count_nonzero(wrong)

    def finish(self, peers: Peers) -> None:
        table = exchange(peers, self._summary)
        k, t = self._k, self._tail
        if self.float_sum:
            self._judge_float(table[:, :3 * k].view(np.float64))
        elif self.int_sum:
            self._judge_integer(table[:, 3 * k:t])
        if self.copies:
            self._judge_copies(table[:, t])
        if self.op in ("min", "max"):
            for r in range(self.size):
                n = int(table[r, t + 1])
                if n:
                    side = "below" if self.op == "max" else "above"
                    self.findings.append(f"rank {r}'s {self.op} result is {side} its own input "
                                         f"at {n} element(s)")
                    self._blame([r])

    def _judge_integer(self, table: np.ndarray) -> None:
        """Per region: each holder's result sum against the inputs' (modulo 2**bits)."""
        bits = np.dtype(self.dtype).itemsize * 8
        regions = len(self._regions)
        bad = []
        for g, (a, b) in enumerate(self._regions):
            expected = sum(int(v) for v in table[:, g]) & ((1 << bits) - 1)
            for r in self._holders[g]:
                got = int(table[r, regions + g])
                if got != expected:
                    bad.append(r)
                    self.findings.append(f"rank {r}'s result (elements {a}..{b - 1}) sums to "
                                         f"{got} (mod 2**{bits}), the inputs to {expected}")
        self._blame(bad)

    def _blame(self, bad: list[int]) -> None:
        """Where every rank holds the whole result (allreduce) and all of them are wrong,
        the reduction itself is suspect; where each result has one holder (reduce,
        reduce_scatter), its holder is named: the reduction into it went wrong."""
        if len(self._holders[0]) > 1 and len(set(bad)) == self.size:
            self.reduction_suspect = True
        else:
            self.suspects.update(bad)
            self.reduced_into = len(self._holders[0]) == 1

    def _judge_copies(self, sums: np.ndarray) -> None:
        """Exact results are the same bits everywhere: ranks outside the majority differ."""
        values = [int(v) for v in sums]
        common = max(set(values), key=values.count)
        if values.count(common) * 2 <= len(values):
            if len(set(values)) > 1:
                self.findings.append("the ranks' results differ: word sums "
                                     + ", ".join(f"{v:#x}" for v in values))
                self.reduction_suspect = True
            return
        for r, v in enumerate(values):
            if v != common:
                self.suspects.add(r)
                self.findings.append(f"rank {r}'s result (word sum {v:#018x}) differs from "
                                     f"the other ranks' ({common:#018x})")

    def _judge_float(self, table: np.ndarray) -> None:
        """Per chunk: |result sum - expected| <= bound, for each rank holding it
        (docs/integrity.md)."""
        k, p = self._k, self.size
        expected = table[:, :k].sum(axis=0)
        magnitude = table[:, k:2 * k].sum(axis=0)
        results = table[:, 2 * k:3 * k]
        scale = 1.0 / p if self.op == "avg" else 1.0
        u = checksums.UNIT_ROUNDOFF[self.dtype]
        # the float64 sums of the checksums themselves: numpy's pairwise summation adds up
        # to 16 + log2(n) terms in a row; the sum over ranks p more (generous: + 8)
        depth = math.ceil(math.log2(max(self.chunk, 2))) + 2 * p + 24
        rel = 2.0 * (_gamma(p + 1, u) + _gamma(depth, 2.0 ** -53))
        info = np.finfo(np.float32 if self.dtype == "bfloat16" else self.dtype)
        bound = rel * magnitude * scale + 4.0 * (p + 1) * self.chunk * float(info.tiny)
        # a chunk whose magnitudes reach the dtype's largest value may overflow to inf
        # legitimately; inf or NaN inputs leave nothing to compare
        top = float(info.max) * (1.0 - 4.0 * (p + 1) * u)
        checkable = np.isfinite(expected) & np.isfinite(magnitude) & (magnitude < top)
        with np.errstate(invalid="ignore", over="ignore"):
            off = np.abs(results - expected * scale)
            bad = checkable & ~(off <= bound)          # NaN or inf results count as bad
            bad &= self._holds()
        failing = np.nonzero(bad.any(axis=0))[0]
        for c in failing[:64]:
            ranks = [r for r in range(p) if bad[r, c]]
            g = int(np.searchsorted(self._first, c, side="right")) - 1
            a = self._regions[g][0] + (int(c) - self._first[g]) * self.chunk
            b = min(a + self.chunk, self._regions[g][1])
            worst = ranks[0]
            self.findings.append(
                f"elements {a}..{b - 1}: the result sums to {results[worst, c]!r} on rank(s) "
                f"{ranks}, the inputs to {expected[c] * scale!r} (rounding bound "
                f"{bound[c]:.3g})")
            self._blame(ranks)


    def _holds(self) -> np.ndarray:
        """(rank, chunk): whether the rank holds that chunk's result."""
        holds = np.zeros((self.size, self._k), dtype=bool)
        for g, ranks in enumerate(self._holders):
            holds[ranks, self._first[g]:self._first[g + 1]] = True
        return holds


def _gamma(n: int, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of n roundings."""
    return n * u / (1.0 - n * u)


def p2p_sum(arr: np.ndarray) -> np.ndarray:
    """What a checked send sends after its data: the data's word sum and byte count."""
    return np.array([checksums.word_sum(checksums.as_bytes(arr)), arr.nbytes],
                    dtype=np.uint64)


def p2p_verdict(check: Check, src: int, dst: int, sent: np.ndarray, got: np.ndarray) -> None:
    """Compare a send's checksum with its receiver's (both sides hold both)."""
    if int(sent[0]) != int(got[0]):
        check.links.add((src, dst))
        check.suspects.add(dst)
        check.findings.append(f"the message rank {src} sent to rank {dst} has checksum "
                              f"{int(sent[0]):#018x} at rank {src} and {int(got[0]):#018x} "
                              f"at rank {dst}")


#: what ``integrity=True`` checks, for the errors of calls it does not (docs/integrity.md)
COVERED = ("integrity checks cover allreduce, reduce and reduce_scatter with sum, avg or "
           "premul_sum of floats and sum of integers; min and max (for reduce and "
           "reduce_scatter only that no result is below (max) or above (min) its holder's own "
           "input); for allreduce also the exact ops (bitwise, integer prod and avg) by "
           "comparing the ranks' copies; broadcast, allgather, alltoall, gather, scatter, and "
           "send/recv")


def sum_check(rank: int, size: int, collective: str, op: ReduceOp, dtype: str, count: int,
              asked: bool | None, *, root: int | None = None, blocks: bool = False
              ) -> SumCheck | None:
    """The check of a reduction chosen for checking: a ``SumCheck``, or None where its op
    and dtype leave nothing to compare (sampled by ``PYCOLL_INTEGRITY``: it runs unchecked)
    or ``InvalidArgument`` where ``integrity=True`` asked for one (before any byte moves)."""
    integer = dtype != "bfloat16" and np.dtype(dtype).kind in _INTEGER_KINDS
    covered = (op.name in ("min", "max") or (integer and op.name == "sum")
               or (not integer and op.name in ("sum", "avg", "premul_sum")
                   and dtype in checksums.UNIT_ROUNDOFF)
               or (collective.startswith("allreduce") and (integer or op.name in _EXACT_OPS)))
    if covered:
        return SumCheck(rank, size, collective, op, dtype, count, root=root, blocks=blocks)
    if asked:
        raise InvalidArgument(
            f"rank {rank}: {collective}: integrity=True, but op {op.name} on {dtype} has no "
            f"integrity check ({COVERED}). Pass integrity=False (or leave it unset) for this "
            "call")
    return None


def refuse(rank: int, collective: str, asked: bool | None) -> None:
    """``integrity=True`` on a call that has no check: ``InvalidArgument`` (None or False:
    the call runs unchecked, also when ``PYCOLL_INTEGRITY`` samples it)."""
    if asked:
        raise InvalidArgument(
            f"rank {rank}: {collective}: integrity=True, but {collective} has no integrity "
            f"check ({COVERED}). Pass integrity=False (or leave it unset), or run the same "
            "data through a covered call")
