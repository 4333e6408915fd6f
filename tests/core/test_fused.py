"""allgather_coalesced (torch's [rank][i] layout) and allgatherv (lengths not known ahead)."""
from __future__ import annotations

import numpy as np
import pytest

from pycoll.errors import InvalidArgument, InvalidDtype
from pycoll.testing import run_ranks


def _inputs(rank):
    """Different shapes and dtypes per input, values per rank: no transposition can pass."""
    return [np.arange(2, dtype=np.float32) + 10 * rank, np.full((2, 3), rank, dtype=np.int64),
            np.zeros(0, dtype=np.float64), (np.arange(3) + 1j * rank).astype(np.complex128)]


def _coalesced(comm):
    ins = _inputs(comm.rank)
    outs = [[np.full_like(t, -1) for t in ins] for _ in range(comm.size)]
    comm.allgather_coalesced(outs, ins)
    for r in range(comm.size):
        for got, want in zip(outs[r], _inputs(r)):
            assert got.dtype == want.dtype and np.array_equal(got, want), (r, got, want)
    outs2 = [[np.empty_like(t) for t in ins] for _ in range(comm.size)]
    w = comm.allgather_coalesced(outs2, ins, async_op=True)
    assert w.result(30) is outs2 or w.result(30) == outs2
    errors = []
    for bad in ([[np.empty_like(t) for t in ins]] * (comm.size + 1),      # a list too many
                [[np.empty(5, np.float32)] + [np.empty_like(t) for t in ins[1:]]] * comm.size):
        try:
            comm.allgather_coalesced(bad, ins)
        except InvalidArgument as e:
            errors.append(str(e))
    try:
        comm.allgather_coalesced([[np.empty(2, np.int32)] + [np.empty_like(t) for t in ins[1:]]]
                                 * comm.size, ins)
    except InvalidDtype as e:
        errors.append(str(e))
    return errors


@pytest.mark.parametrize("size", [1, 2, 3])
def test_allgather_coalesced_layout_and_errors(size):
    for errors in run_ranks(_coalesced, size):
        assert len(errors) == 3, errors
        assert "one per rank" in errors[0] and "elements" in errors[1], errors


def _varying(comm):
    r = comm.rank
    parts = comm.allgatherv(np.arange(3 * r, dtype=np.int32) + 100 * r)   # rank 0: empty
    w = comm.allgatherv(np.full(r % 2, 1.5 + r), async_op=True)
    fut = w.get_future()
    big = comm.allgatherv(np.full(200_000 + r, r, dtype=np.uint8))
    return ([p.tolist() for p in parts], [p.tolist() for p in fut.result(30)],
            [(len(p), int(p.min()) if len(p) else None) for p in big])


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_allgatherv_lengths_not_known_in_advance(transport):
    results = run_ranks(_varying, 3, env={"PYCOLL_TRANSPORTS": transport})
    for parts, odd, big in results:
        assert parts == [[], [100, 101, 102], list(range(200, 206))]
        assert odd == [[], [2.5], []]
        assert big == [(200_000, 0), (200_001, 1), (200_002, 2)]
