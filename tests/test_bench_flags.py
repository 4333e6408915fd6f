"""``python -m pycoll.bench``: ``-d cuda`` stops at once with a clear message (no CUDA support
yet), and ``--help`` states the default size ranges the code uses."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pycoll.bench.backend import CUDA_UNAVAILABLE, PycollBackend
from pycoll.bench.cli import main
from pycoll.bench.options import build_parser, format_size, parse_args
from pycoll.bench.runner import BenchError


def test_cuda_device_is_refused_before_any_rank_starts(capsys):
    assert main(["allreduce", "-d", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"pycoll.bench: {CUDA_UNAVAILABLE}"
    assert "not available" in err and "-d cpu" in err


def test_cuda_device_is_refused_by_the_backend():
    with pytest.raises(BenchError, match="not available"):
        PycollBackend("cuda")


def test_cuda_device_from_the_command_line_has_no_traceback():
    out = subprocess.run([sys.executable, "-m", "pycoll.bench", "allreduce", "-d", "cuda"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.count("-d cuda is not available yet") == 1, out.stderr


@pytest.mark.parametrize("collective", ["allreduce", "latency", "bw"])
def test_help_states_the_default_size_range(collective):
    opts = parse_args([collective])
    lo, hi = opts.min_size, opts.max_size
    text = f"{lo}:{format_size(hi).replace('MiB', 'M')}"
    helps = {a.dest: a.help for a in build_parser()._actions}
    assert text in helps["message_size"], (text, helps["message_size"])
