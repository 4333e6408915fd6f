"""Rank 0's metrics page and what it keeps: scrapes in a loop start one straggler survey, on a
thread of its own (a scrape never waits for one), and a finalized group's tallies leave the
page. Real ranks over a real store; needs no prometheus_client (the page is not parsed)."""
from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)


def _scraped_in_a_loop(comm: Any) -> dict[str, Any]:
    """Rank 0's page built 5 times in a row, counting the straggler surveys it starts (the
    real survey, counted on its way), then a group made, paged and finalized."""
    from pycoll.comm import status
    surveys: list[int] = []
    real = status.job_stragglers

    def counted(*args: Any, **kw: Any) -> Any:
        surveys.append(1)
        return real(*args, **kw)

    status.job_stragglers = counted
    try:
        for _ in range(5):
            comm._metrics_text()
        cache = getattr(comm, "_survey_cache", None)
        end = time.monotonic() + 60
        while cache is not None and cache._running and time.monotonic() < end:
            time.sleep(0.01)
        pages = len(surveys)
    finally:
        status.job_stragglers = real
    group = comm.new_group(list(range(comm.size)))
    comm._metrics_text()
    with_group = len(comm._tallies)
    group.finalize()
    comm._metrics_text()
    return {"surveys": pages, "tallies": (with_group, len(comm._tallies))}


def test_scrapes_share_one_survey_and_finalized_groups_leave_the_page() -> None:
    """A loop of scrapes starts one straggler survey, on a thread (the page never waits
    for one), and a finalized group's tallies are dropped, not kept forever."""
    from pycoll.testing import run_ranks
    out = run_ranks(_scraped_in_a_loop, 2)
    assert out[0] == {"surveys": 1, "tallies": (2, 1)}, out
    assert out[1] == {"surveys": 0, "tallies": (2, 1)}, out
