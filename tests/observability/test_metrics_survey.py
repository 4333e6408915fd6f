"""Rank 0's metrics page and what it keeps: scrapes in a loop start one straggler survey, on a
thread of its own (a scrape never waits for one), and a finalized group's tallies leave the
page. Real ranks over a real store; needs no prometheus_client (the page is not parsed)."""
from __future__ import annotations

import os
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


def _fails_while_scraped(comm: Any, signal: str) -> str:
    """Rank 0's inline allreduce is scraped while it waits for rank 1, which then makes a
    mismatching call: the page after it must count that call as failed."""
    import threading

    import numpy as np
    comm.allreduce(np.ones(8, np.float32))          # the kind bound: the next runs inline
    if comm.rank == 1:
        end = time.monotonic() + 60
        while not os.path.exists(signal) and time.monotonic() < end:
            time.sleep(0.001)
        try:
            comm.allreduce(np.ones(16, np.float32))
        except Exception as e:  # noqa: BLE001 - the failure is the point
            return type(e).__name__
        return "NO ERROR"

    def scrape() -> None:
        end = time.monotonic() + 60
        while comm._exec.running_inline() is None and time.monotonic() < end:
            time.sleep(0.001)
        comm._metrics_text()                         # folds what it judges finished
        open(signal, "w").close()      # (a file: the rank's store connection is its own)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        comm.allreduce(np.ones(8, np.float32))
        raised = "NO ERROR"
    except Exception as e:  # noqa: BLE001
        raised = type(e).__name__
    scraper.join(60)
    errors = [line for line in comm._metrics_text().splitlines()
              if line.startswith("pycoll_collective_errors_total")
              and 'collective="allreduce"' in line]
    return f"{raised} {errors[0].rsplit(' ', 1)[1] if errors else 'none'}"


def test_an_inline_call_scraped_while_it_runs_then_failing_counts_as_failed(tmp_path: Any
                                                                           ) -> None:
    """An inline call is recorded completed when it begins; a scrape while it runs must not
    fold it as a success before it ends."""
    from pycoll.testing import run_ranks
    out = run_ranks(_fails_while_scraped, 2, str(tmp_path / "scraped"),
                    env={"PYCOLL_TRANSPORTS": "shm"})
    assert out[0].endswith(" 1") and not out[0].startswith("NO ERROR"), out
