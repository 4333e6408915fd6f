#!/usr/bin/env python3
"""How accurate a float16/bfloat16 sum is, accumulated in float32 (``accumulate="fp32"``)
and in the dtype, against the exact (float64) sum of the same inputs.

    python benchmarks/experiments/half_precision_error.py [--count 200000] [--out results.md]

The fold is pycoll's (``pycoll.buffers.folding.reference``: the rank-order fold every
deterministic reduction returns, tests/algorithms/test_deterministic.py checks it against
the ranks' results), on n = 2, 4, 8 inputs of random normal values times 10^k, k uniform in
[-s, s] (s = 0, 2, 4; 3 at most for float16, whose range ends at 65504). Three measures:

* relative error: mean of |result - exact| / |exact| (what a user of the result sees; it
  includes the result's own rounding to the dtype, which no accumulation avoids: about a
  quarter of the dtype's epsilon on average);
* error / sum |x|: the same, scaled by the inputs' magnitudes (the usual summation bound);
* missed: the fraction of elements that are not the correctly rounded exact sum.
"""
from __future__ import annotations

import argparse

import numpy as np

from pycoll.buffers.folding import reference


def _bf16(values: np.ndarray) -> np.ndarray:
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _wide(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def _to(values: np.ndarray, dtype: str) -> np.ndarray:
    return _bf16(values) if dtype == "bfloat16" else values.astype(dtype)


def measure(dtype: str, n: int, spread: int, count: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(7 * n + spread)
    inputs = [_to(rng.standard_normal(count) * 10.0 ** rng.integers(-spread, spread + 1, count),
                  dtype) for _ in range(n)]
    wide = [_wide(x, dtype) for x in inputs]
    exact = np.sum(wide, axis=0)
    best = _wide(_to(exact.astype(np.float32), dtype), dtype)
    magnitude = np.sum(np.abs(wide), axis=0)
    out = {}
    for accumulate in ("fp32", "dtype"):
        got = _wide(reference(inputs, dtype=dtype, accumulate=accumulate), dtype)
        ok = np.isfinite(got) & (exact != 0)
        err = np.abs(got[ok] - exact[ok])
        out[accumulate] = {"relative": float(np.mean(err / np.abs(exact[ok]))),
                           "per_magnitude": float(np.mean(err / magnitude[ok])),
                           "missed": float(np.mean(got[ok] != best[ok]))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--out", help="write the markdown table here")
    args = ap.parse_args()
    lines = ["| dtype | n | spread | relative error fp32 / dtype (ratio) | error / sum abs x "
             "fp32 / dtype (ratio) | missed fp32 / dtype |", "|---|---|---|---|---|---|"]
    np.seterr(all="ignore")
    for dtype in ("float16", "bfloat16"):
        for spread in ((0, 2, 3) if dtype == "float16" else (0, 2, 4)):
            for n in (2, 4, 8):
                m = measure(dtype, n, spread, args.count)
                f, d = m["fp32"], m["dtype"]
                lines.append(
                    f"| {dtype} | {n} | {spread} | {f['relative']:.2e} / {d['relative']:.2e} "
                    f"({d['relative'] / f['relative']:.1f}x) | {f['per_magnitude']:.2e} / "
                    f"{d['per_magnitude']:.2e} ({d['per_magnitude'] / f['per_magnitude']:.1f}x)"
                    f" | {f['missed']:.4f} / {d['missed']:.4f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
