"""A sample of the kill -9 trials (benchmarks/elastic_trials.py runs 100 per configuration):
a rank dies at a random moment of a loop of mixed, checked collectives (inside an agree, or a
second rank dies during the shrink or the grow); every survivor must end on the same shrunk
(or grown) communicator, with every returned result right."""
from __future__ import annotations

import pytest

from pycoll.testing.kill_trials import run_trial

pytestmark = pytest.mark.timeout(200)


@pytest.mark.parametrize("n, transport, mode, seed", [
    (4, "shm", "loop", 1), (4, "tcp", "loop", 2), (8, "shm", "loop", 3),
    (4, "shm", "agree", 4), (4, "tcp", "shrink", 5), (4, "shm", "shrink", 6),
    (4, "shm", "grow", 7), (4, "shm", "growkill", 8),
])
def test_survivors_recover_with_correct_results(n: int, transport: str, mode: str,
                                                seed: int) -> None:
    result = run_trial(n, transport, mode, seed, timeout=150)
    assert result.ok, result.why
    assert result.recovery_s, result
