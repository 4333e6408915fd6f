"""Encode/decode time of one 64 MiB float32 buffer per wire format: the compiled codec
(``Codec.encode``/``decode``) against the numpy reference (``encode_numpy``/``decode_numpy``),
median of 5 after one warm-up call. ``python benchmarks/codec_speed.py [MiB]``."""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from pycoll.buffers import compression as cz


def median_s(fn, *args) -> float:
    fn(*args)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    x = np.random.default_rng(0).standard_normal(mib * 2**20 // 4).astype(np.float32)
    out = np.empty_like(x)
    print(f"{mib} MiB float32, median of 5 (s)")
    print(f"{'format':6} {'enc numpy':>10} {'enc numba':>10} {'ratio':>6} "
          f"{'dec numpy':>10} {'dec numba':>10} {'ratio':>6}")
    for fmt in cz.FORMATS:
        c = cz.codec(fmt)
        wire = np.empty(c.wire_nbytes(x.size), dtype=np.uint8)
        en, ef = median_s(c.encode_numpy, x, wire), median_s(c.encode, x, wire)
        dn, df = median_s(c.decode_numpy, wire, out), median_s(c.decode, wire, out)
        print(f"{fmt:6} {en:10.3f} {ef:10.3f} {en / ef:6.1f} {dn:10.3f} {df:10.3f} "
              f"{dn / df:6.1f}")


if __name__ == "__main__":
    main()
