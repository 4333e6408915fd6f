"""The fixture the observability tests share: ``job(n, **env)`` starts ``n`` rank processes of
status_job.py (test_status.Job) and reaps them all when the test ends."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_status import Job, N


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Any]:
    jobs: list[Job] = []

    def make(n: int = N, **env: Any) -> Job:
        jobs.append(Job(tmp_path, n, **env))   # script=...: another job than status_job.py
        return jobs[-1]
    yield make
    for j in jobs:
        j.close()
