"""``--check-every N``: validate the iterations themselves, not one extra run after them.

``-c`` checks one untimed run on patterned data after the timing, so a result that goes wrong
once in a thousand calls (a race, a flipped bit) passes. nccl-tests' ``-c N`` checks the
iterations it runs. Here every iteration gets patterned inputs written before it (untimed),
and every N-th one is checked after it (untimed), before the barrier that ends it. The
timed region is the same as the plain loop's (op and sync); what changes is that the
buffers are warm in cache from the write, which the docs say.

A rank that finds a wrong element prints ``DATA VALIDATION ERROR`` at once, naming the
iteration, the rank, the element, what it expected and what it got, and goes on: the other
ranks cannot know, and stopping alone would leave them waiting in the next call. The counts
are exchanged once the size is done, and a failed size stops the sweep (``runner``).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from . import collectives as C


@dataclass
class CheckTally:
    """What one rank found over one size's iterations."""

    checked: int = 0          # iterations checked
    failed: int = 0           # of those, with a wrong element
    wrong: int = 0            # wrong elements, summed over iterations
    first_bad: int = -1       # the first failing iteration (warm-up first, from 0); -1: none


def iteration_name(it: int, warmup: int, iters: int) -> str:
    """'timed iteration 3 of 20 (iteration 5 counting 2 warm-up)' / 'warm-up iteration 1
    of 2 (iteration 1)': what a user needs to find the call again."""
    if it < warmup:
        return f"warm-up iteration {it} of {warmup} (iteration {it})"
    return (f"timed iteration {it - warmup} of {iters} (iteration {it} counting {warmup} "
            "warm-up)")


class _Patterns:
    """Inputs and expected output per root, made once per root (``-k rotate`` cycles)."""

    def __init__(self, step, rank: int):
        self.step = step
        self.rank = rank
        self._cache: dict[int, tuple[dict, tuple | None]] = {}

    def get(self, root: int) -> tuple[dict, tuple | None]:
        found = self._cache.get(root)
        if found is None:
            s = self.step
            found = (C.validation_inputs(s.collective, s.layout, self.rank, s.n, root,
                                         s.dtype, s.op),
                     C.validation_expected(s.collective, s.layout, self.rank, s.n, root,
                                           s.dtype, s.op))
            if len(self._cache) > 1:      # rotate over many roots: keep memory bounded
                self._cache.clear()
            self._cache[root] = found
        return found


def measure_checked(backend, step, iters: int, warmup: int, every: int, roots: list[int],
                    algo: str | None, corrupt_rank: int | None) -> tuple[np.ndarray, CheckTally]:
    """OSU timing with patterned inputs before every iteration and a check after every
    ``every``-th; returns this rank's per-iteration times (s) and what the checks found."""
    b = backend
    coll, bufs, op = step.collective, step.bufs, step.op
    patterns = _Patterns(step, b.rank)
    tally = CheckTally()
    times = np.empty(iters)
    perf = time.perf_counter
    for it in range(warmup + iters):
        r = roots[it % len(roots)]
        inputs, expected = patterns.get(r)
        for name, arr in inputs.items():
            b.write(bufs[name], arr)
        t0 = perf()
        b.op(coll, bufs, op, r, algo)
        b.sync()
        t1 = perf()
        if it >= warmup:
            times[it - warmup] = t1 - t0
        if expected is not None and it % every == 0:
            _check(b, step, it, warmup, iters, expected, corrupt_rank, tally)
        b.barrier()
    return times, tally


def _check(b, step, it: int, warmup: int, iters: int, expected: tuple, corrupt_rank,
           tally: CheckTally) -> None:
    name, want = expected
    got = np.asarray(b.read(step.bufs[name])).reshape(-1)
    if corrupt_rank is not None and corrupt_rank == b.rank:
        got = C.corrupt(got)
    tally.checked += 1
    wrong = C.count_wrong(got, want, step.op)
    if not wrong:
        return
    tally.failed += 1
    tally.wrong += wrong
    if tally.first_bad >= 0:
        return
    tally.first_bad = it
    i = C.first_wrong(got, want, step.op) or 0
    print(f"DATA VALIDATION ERROR: {step.collective} of {step.layout.nbytes} B "
          f"({step.dtype}{', ' + step.op if C.SPECS[step.collective].reduction else ''}) "
          f"on rank {b.rank} of {step.n}, {iteration_name(it, warmup, iters)}: "
          f"element {i} of {got.size} expected {_value(want, i)} got {_value(got, i)} "
          f"({wrong} wrong in this iteration). Later iterations go on; to learn "
          "which link changed the bytes, rerun with PYCOLL_INTEGRITY=on (docs/integrity.md)",
          file=sys.stderr, flush=True)


def _value(a: np.ndarray, i: int) -> str:
    return repr(a[i].item()) if i < a.size else "nothing (the result is shorter)"


def tally_floats(tally: CheckTally) -> list[float]:
    """This rank's tally as the floats ``allgather_floats`` exchanges."""
    return [float(tally.checked), float(tally.failed), float(tally.wrong),
            float(tally.first_bad)]


def check_fields(stats: np.ndarray, every: int) -> dict:
    """The row's fields from every rank's ``tally_floats`` (a (ranks, 4) array)."""
    bad = [int(x) for x in stats[:, 3] if x >= 0]
    wrong = int(stats[:, 2].sum())
    return {"check_every": every, "checked_iterations": int(stats[:, 0].max()),
            "failed_checks": int(stats[:, 1].sum()),
            "first_bad_iteration": min(bad) if bad else None,
            "validation": "Pass" if wrong == 0 and not bad else "Fail", "wrong": wrong}
