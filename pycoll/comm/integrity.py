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
* sums (allreduce with sum, avg, premul_sum): per chunk, the sum of the result against the
  sum of the ranks' input sums, within a rounding bound for floats and exactly (modulo
  2**bits) for integers (``SumCheck``); the ranks whose result fails are the suspects, all
  of them when the reduction itself went wrong;
* every exact reduction (integers, min/max, bitwise) leaves the same bits on every rank: a
  rank whose result's word sum differs from the others' is suspect; min and max also check
  locally that the result is not below (above) this rank's own input.
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
from ..errors import DataCorruption

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
        ALGORITHMS["allgather"]["recursive_doubling"](
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
    the input (after premul_sum's scaling), ``after`` on the result, then ``finish``."""

    def __init__(self, rank: int, size: int, collective: str, op: ReduceOp, dtype: str,
                 count: int) -> None:
        super().__init__(rank, size, collective)
        self.op = op.name
        self.dtype = dtype
        self.count = count
        self.integer = dtype != "bfloat16" and np.dtype(dtype).kind in _INTEGER_KINDS
        self.float_sum = not self.integer and self.op in ("sum", "avg", "premul_sum") \
            and dtype in checksums.UNIT_ROUNDOFF
        # exact results are the same bits on every rank: compare the copies (an integer
        # sum's own check says exactly which results are wrong; a majority vote would blame
        # the correct ranks when a corrupted block was forwarded to most of them)
        self.copies = ((self.integer or self.op in _EXACT_OPS)
                       and not (self.integer and self.op == "sum"))
        self.chunk = checksums.chunk_length(dtype, size) if self.float_sum else 0
        chunks = -(-count // self.chunk) if self.float_sum else 0
        # summary: [input sums, input magnitudes, result sums] per chunk (float64 bits),
        # then the integer input and result sums, the result's word sum, min/max violations
        self._k = chunks
        self._summary = np.zeros(3 * chunks + 4, dtype=np.uint64)
        self._input: np.ndarray | None = None

    def before(self, arr: np.ndarray) -> None:
        s = self._summary
        k = self._k
        if self.float_sum:
            sums, mags = checksums.chunk_sums(checksums.as_float(arr, self.dtype), self.chunk)
            s[:k] = sums.view(np.uint64)
            s[k:2 * k] = mags.view(np.uint64)  # type: ignore[union-attr]
        elif self.integer and self.op == "sum":
            s[3 * k] = checksums.modular_sum(arr)
        if self.op in ("min", "max"):
            self._input = arr.reshape(-1).copy()

    def after(self, arr: np.ndarray) -> None:
        s = self._summary
        k = self._k
        flat = arr.reshape(-1)
        if self.float_sum:
            sums, _ = checksums.chunk_sums(checksums.as_float(arr, self.dtype), self.chunk,
                                           absolute=False)
            s[2 * k:3 * k] = sums.view(np.uint64)
        elif self.integer and self.op == "sum":
            s[3 * k + 1] = checksums.modular_sum(arr)
        if self.copies:
            s[3 * k + 2] = checksums.word_sum(checksums.as_bytes(flat))
        if self._input is not None:
            values = checksums.as_float(flat, self.dtype) if self.dtype == "bfloat16" else flat
            mine = (checksums.as_float(self._input, self.dtype)
                    if self.dtype == "bfloat16" else self._input)
            wrong = values < mine if self.op == "max" else values > mine
            s[3 * k + 3] = np.count_nonzero(wrong)

    def finish(self, peers: Peers) -> None:
        table = exchange(peers, self._summary)
        k = self._k
        if self.float_sum:
            self._judge_float(table[:, :3 * k].view(np.float64))
        elif self.integer and self.op == "sum":
            bits = np.dtype(self.dtype).itemsize * 8
            expected = sum(int(v) for v in table[:, 3 * k]) & ((1 << bits) - 1)
            bad = [r for r in range(self.size) if int(table[r, 3 * k + 1]) != expected]
            for r in bad:
                self.findings.append(f"rank {r}'s result sums to {int(table[r, 3 * k + 1])} "
                                     f"(mod 2**{bits}), the inputs to {expected}")
            self._blame(bad)
        if self.copies:
            self._judge_copies(table[:, 3 * k + 2])
        if self.op in ("min", "max"):
            for r in range(self.size):
                n = int(table[r, 3 * k + 3])
                if n:
                    side = "below" if self.op == "max" else "above"
                    self.findings.append(f"rank {r}'s {self.op} result is {side} its own input "
                                         f"at {n} element(s)")
                    self._blame([r])

    def _blame(self, bad: list[int]) -> None:
        if len(bad) == self.size:
            self.reduction_suspect = True
        else:
            self.suspects.update(bad)

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
        """Per chunk: |result sum - expected| <= bound, for each rank (docs/integrity.md)."""
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
        failing = np.nonzero(bad.any(axis=0))[0]
        for c in failing[:64]:
            ranks = [r for r in range(p) if bad[r, c]]
            a = int(c) * self.chunk
            b = min(a + self.chunk, self.count)
            worst = ranks[0]
            self.findings.append(
                f"elements {a}..{b - 1}: the result sums to {results[worst, c]!r} on rank(s) "
                f"{ranks}, the inputs to {expected[c] * scale!r} (rounding bound "
                f"{bound[c]:.3g})")
            self._blame(ranks)


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
