"""pycoll.bench: OSU-style micro-benchmarks with nccl-tests algbw/busbw.

``python -m pycoll.bench allreduce -n 2 -m 8:16M -c -f`` -- see docs/bench.md.

Modules: ``options`` (flags, sizes, OSU defaults), ``collectives`` (buffer layouts, busbw
factors, validation data), ``runner`` (the timing loop, shared with benchmarks/peers),
``backend`` (pycoll adapter), ``report`` (OSU/nccl-tests/JSON/CSV output and parsers),
``plot`` (matplotlib, imported lazily), ``cli`` (the command).
"""
from .options import message_sizes, parse_message_range, parse_size  # noqa: F401


def main(argv=None) -> int:
    from .cli import main as _main
    return _main(argv)
