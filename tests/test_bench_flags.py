"""``python -m pycoll.bench --help`` states the default size ranges the code uses (``-d cuda``
without a GPU: tests/bench/test_cuda.py)."""
from __future__ import annotations

import pytest

from pycoll.bench.options import build_parser, format_size, parse_args


@pytest.mark.parametrize("collective", ["allreduce", "latency", "bw"])
def test_help_states_the_default_size_range(collective):
    opts = parse_args([collective])
    lo, hi = opts.min_size, opts.max_size
    text = f"{lo}:{format_size(hi).replace('MiB', 'M')}"
    helps = {a.dest: a.help for a in build_parser()._actions}
    assert text in helps["message_size"], (text, helps["message_size"])
