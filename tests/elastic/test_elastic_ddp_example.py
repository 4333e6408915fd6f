"""examples/elastic_ddp.py under pycoll.run --elastic: a rank is SIGKILLed mid-training, the
survivors shrink and go on, the launcher's replacement joins through grow, and the loss curve
equals the uninterrupted run's (the same global batch every step)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_ddp.py"


def _run(tmp_path: Path, name: str, launcher: list[str], *extra: str) -> tuple[dict, str]:
    out = tmp_path / f"{name}.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "pycoll.run", *launcher, "-n", "4", "--timeout", "200",
         str(EXAMPLE), "--steps", "14", "--width", "32", "--grow-every", "3", "--out", str(out),
         *extra],
        cwd=str(ROOT), capture_output=True, text=True, timeout=220,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    losses: dict = {}
    for line in out.read_text().splitlines():
        step, loss, ranks = line.split()
        losses[int(step)] = (float(loss), int(ranks))   # a redone step: the last one counts
    return losses, proc.stderr


def test_killed_rank_replaced_and_loss_curve_unchanged(tmp_path: Path) -> None:
    plain, _ = _run(tmp_path, "plain", [])
    elastic, stderr = _run(tmp_path, "elastic", ["--elastic", "--max-restarts", "1"],
                           "--kill-rank", "2", "--kill-step", "4", "--replacements", "1")
    assert sorted(plain) == sorted(elastic) == list(range(14))
    sizes = [elastic[s][1] for s in range(14)]
    assert sizes[:4] == [4] * 4 and sizes[4] == 3, sizes     # shrunk at the killed step
    assert sizes[-1] == 4, (sizes, stderr)                   # grown back by the replacement
    for step in range(14):
        assert elastic[step][0] == pytest.approx(plain[step][0], rel=1e-5, abs=1e-7), step
    assert "rank 2" in stderr and "SIGKILL" in stderr and "replacement" in stderr, stderr
