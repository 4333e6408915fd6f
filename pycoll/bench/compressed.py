"""``--compress``: what a compressed collective put on the wire and how far its result is
from the exact one, beside the timings (which ran with ``PYCOLL_COMPRESS`` set, so busbw is
on the uncompressed size).

After the sweep, each size runs once more on seeded normal data that every rank can
regenerate for every other rank, so each rank computes the exact result (float64) and the
bound of docs/numerics.md ("Compressed collectives") for its own output without moving more
data; the worst error and the worst error/bound over the ranks are reduced with ``max``
(which is never compressed). Sizes above ``MEASURED_MAX`` skip the measurement: every rank
would hold every rank's input.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..buffers.compression import codec, error_bound
from . import collectives as C
from .options import format_size

#: the largest size measured (bytes of the operation): the check holds n inputs per rank
MEASURED_MAX = 16 << 20


def _data(rank: int, count: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(7919 + rank).standard_normal(count).astype(dtype)


def _measure(comm: Any, collective: str, lay: C.Layout, dtype: str, fmt: str
             ) -> tuple[float, float]:
    """(max |error|, max |error| / bound) of this rank's output."""
    n, r = comm.size, comm.rank
    if collective == "allreduce":
        xs = [_data(q, lay.count, dtype) for q in range(n)]
        got = xs[r].copy()
        comm.allreduce(got)
        exact = np.sum(np.array(xs, dtype=np.float64), axis=0)
        bound = error_bound(xs, fmt, dtype)
    elif collective == "reduce_scatter":
        xs = [_data(q, lay.count, dtype) for q in range(n)]
        got = np.empty(lay.chunk, dtype)
        comm.reduce_scatter(got, xs[r])
        mine = slice(r * lay.chunk, (r + 1) * lay.chunk)
        exact = np.sum(np.array([x[mine] for x in xs], dtype=np.float64), axis=0)
        bound = error_bound([x[mine] for x in xs], fmt, dtype, collective="reduce_scatter")
    elif collective == "allgather":
        xs = [_data(q, lay.chunk, dtype) for q in range(n)]
        got = np.empty(lay.count, dtype)
        comm.allgather(got, xs[r])
        exact = np.concatenate(xs).astype(np.float64)
        bound = np.concatenate([error_bound([x], fmt, dtype, collective="allgather")
                                for x in xs])
    else:                                          # broadcast from rank 0
        x = _data(0, lay.count, dtype)
        got = x.copy() if r == 0 else np.zeros_like(x)
        comm.broadcast(got, 0)
        exact = x.astype(np.float64)
        bound = error_bound([x], fmt, dtype, collective="broadcast")
    err = np.abs(got.astype(np.float64) - exact)
    worst = np.array([err.max(initial=0.0), (err / bound).max(initial=0.0)])
    comm.allreduce(worst, "max")
    return float(worst[0]), float(worst[1])


def error_table(comm: Any, collective: str, sizes: list[int], dtypes: list[str],
                rows: list[dict], fmt: str, osu: bool) -> list[str]:
    """Measure each size (and dtype) once; add ``wire_bytes``, ``max_abs_err`` and
    ``err_over_bound`` to the matching rows, and ``model_pays`` (whether the cost model
    expects compression to make the call faster on these links: ``comm.compression_pays``);
    return the lines to print: comment lines (``osu``: the OSU and nccl formats), else JSON
    lines (jsonl)."""
    n = comm.size
    c = codec(fmt)
    lines = [f"# compress={fmt}: wire bytes (scales included) and the measured error on "
             "normal data, worst over the ranks (docs/numerics.md#compressed-collectives)",
             f"# {'Size':>10}  {'Dtype':>8}  {'Wire bytes':>12}  {'Ratio':>6}  "
             f"{'Max abs error':>14}  {'Error/bound':>11}  {'Model':>7}"] if osu else []
    for dtype in dtypes:
        for size in sizes:
            lay = C.layout(collective, size, dtype, n)
            wire = (n * c.wire_nbytes(lay.chunk) if collective in ("allgather",
                                                                    "reduce_scatter")
                    else c.wire_nbytes(lay.count))
            pays = comm.compression_pays(collective, lay.nbytes, fmt, dtype)
            err = bound = None
            if dtype != "bfloat16" and 0 < lay.nbytes <= MEASURED_MAX:
                err, bound = _measure(comm, collective, lay, dtype, fmt)
            for row in rows:
                if row.get("size") == lay.nbytes and row.get("dtype") == dtype:
                    row.update(compress=fmt, wire_bytes=wire, max_abs_err=err,
                               err_over_bound=bound, model_pays=pays)
            ratio = wire / lay.nbytes if lay.nbytes else 0.0
            if osu:
                e = f"{err:14.4g}" if err is not None else f"{'-':>14}"
                b = f"{bound:11.3f}" if bound is not None else f"{'-':>11}"
                m = "pays" if pays else "no"
                lines.append(f"# {lay.nbytes:>10}  {dtype:>8}  {wire:>12}  {ratio:6.3f}  {e}  {b}"
                             f"  {m:>7}")
            else:
                lines.append(json.dumps({"compress": fmt, "size": lay.nbytes, "dtype": dtype,
                                         "wire_bytes": wire, "max_abs_err": err,
                                         "err_over_bound": bound, "model_pays": pays}))
    if osu:
        lines.append(f"# sizes above {format_size(MEASURED_MAX)} and bfloat16 are not "
                     "measured (-): every rank would hold every rank's input; Model: whether "
                     "the cost model expects compression to pay on these links (pays/no)")
    return lines

