"""The timing loop, shared by pycoll and the peer runners in benchmarks/peers/.

A *backend* adapts one library (pycoll, torch.distributed/Gloo, mpi4py) to a handful of
methods; the loop, the statistics and the validation are the same for every library, so
the numbers in benchmarks/compare.py are measured the same way.

Backend protocol (duck-typed)::

    name, version, rank, world_size
    alloc(count, dtype) -> buf          # dtype: pycoll.bench.options.DTYPES key
    write(buf, ndarray)                 # copy into buf
    read(buf) -> ndarray                # contents (a view where possible)
    barrier()
    sync()                              # wait for the device (no-op on CPU)
    op(collective, bufs, op, root, algo) -> None   # one blocking operation
    send(buf, dst) / recv(buf, src)     # for latency and bw
    allgather_floats(list[float]) -> ndarray (world_size, k)   # statistics exchange
    selected_algorithm(collective, nbytes) -> str | None
    transport() -> str

One-sided tests (put, get, accumulate and their bw forms) also use::

    window(buf) -> win                  # collective: expose buf (MPI_Win_create)
    allocate_window(count, dtype) -> (win, local)   # MPI_Win_allocate, when window_type
                                        # is "allocate" (OSU's -w; the default)
    free_window(win)                    # collective
    lock(win, target) / unlock(win, target)   # the passive-target epoch around the loop
    rma(kind, win, buf, target, offset) # one put/get/accumulate (sum), offset in elements
    flush(win, target)                  # complete them at the target (MPI_Win_flush)

Methodology (OSU 7.4, e.g. ``osu_allreduce.c``): each rank times every operation, with a
barrier after it that is not timed; the per-rank mean over the timed iterations is then
reduced across ranks: Avg = mean of the per-rank means, Min/Max = their extremes.
``timing="nccl"`` runs the timed iterations back to back and divides the total (nccl-tests).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from . import collectives as C
from .iteration_checks import check_fields, measure_checked, tally_floats
from .memory import measure_memory
from .nonblocking import measure_nonblocking, overlap_fields
from .options import PLAIN, Modes, default_iterations


class BenchError(RuntimeError):
    """A benchmark that cannot run (missing collective, bad root, ...)."""


def roots_for(mode: str, root: int, n: int) -> list[int]:
    return list(range(n)) if mode == "rotate" else [root]


def _percentile(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else float("nan")


def tail_fields(backend, times: np.ndarray) -> dict:
    """``-P``: percentiles of the per-iteration latency, an iteration's latency being its
    slowest rank's time (a collective is done when its last rank is; with OSU timing the
    barrier after each op keeps iterations aligned across ranks). Collective: every rank
    passes its own times and gets the same fields."""
    slowest = backend.allgather_floats([float(t) for t in times * 1e6]).max(axis=0)
    return {"tail_p50_us": _percentile(slowest, 50), "tail_p99_us": _percentile(slowest, 99),
            "tail_max_us": float(slowest.max())}


class Step:
    """Buffers of one (collective, size, dtype, op) benchmark on one rank."""

    def __init__(self, backend, collective: str, size: int, dtype: str, op: str):
        self.b = backend
        self.collective = collective
        self.dtype = dtype
        self.op = op
        self.n = backend.world_size
        self.layout = C.layout(collective, size, dtype, self.n)
        self.bufs = {name: backend.alloc(cnt, dtype) for name, cnt in self.layout.buffers.items()}
        # Touch every page: untouched zero pages would make reads artificially cheap.
        # Reductions get the op's identity-like fill so repeated in-place ops stay bounded.
        fill = 1 if (op == "prod" and C.SPECS[collective].reduction) else 0
        cd = C.compute_dtype(dtype)
        for name, cnt in self.layout.buffers.items():
            backend.write(self.bufs[name], np.full(cnt, fill, dtype=cd))

    def free(self):
        self.bufs.clear()


def _check_root(collective: str, root: int, n: int):
    if C.SPECS[collective].rooted and not (0 <= root < n):
        raise BenchError(f"root {root} out of range for {n} ranks")


def measure(backend, step: Step, iters: int, warmup: int, timing: str,
            root_mode: str, root: int, algo: str | None):
    """Run warm-up + timed iterations; return this rank's per-iteration times (s)."""
    b = backend
    roots = roots_for(root_mode, root, step.n)
    coll, bufs, op = step.collective, step.bufs, step.op
    do = b.op
    times = np.empty(iters if timing == "osu" else 1)
    perf = time.perf_counter
    if timing == "osu":
        for it in range(warmup + iters):
            r = roots[it % len(roots)]
            t0 = perf()
            do(coll, bufs, op, r, algo)
            b.sync()
            t1 = perf()
            if it >= warmup:
                times[it - warmup] = t1 - t0
            b.barrier()
    else:
        for it in range(warmup):
            do(coll, bufs, op, roots[it % len(roots)], algo)
        b.sync()
        b.barrier()
        t0 = perf()
        for it in range(iters):
            do(coll, bufs, op, roots[it % len(roots)], algo)
        b.sync()
        times[0] = (perf() - t0) / iters
        b.barrier()
    return times


def validate(backend, step: Step, root_mode: str, root: int, algo: str | None,
             corrupt_rank: int | None) -> int:
    """Run the op on patterned data once per root; return this rank's wrong elements."""
    b = backend
    wrong = 0
    n = step.n
    for r in roots_for(root_mode, root, n):
        inputs = C.validation_inputs(step.collective, step.layout, b.rank, n, r,
                                     step.dtype, step.op)
        for name, arr in inputs.items():
            b.write(step.bufs[name], arr)
        b.barrier()
        b.op(step.collective, step.bufs, step.op, r, algo)
        b.sync()
        exp = C.validation_expected(step.collective, step.layout, b.rank, n, r,
                                    step.dtype, step.op)
        if exp is not None:
            name, expected = exp
            actual = np.asarray(b.read(step.bufs[name])).reshape(-1)
            if corrupt_rank is not None and corrupt_rank == b.rank:
                actual = C.corrupt(actual)
            wrong += C.count_wrong(actual, expected, step.op)
        b.barrier()
    return wrong


def budget_iterations(backend, step: Step, iters: int, warmup: int, budget: float,
                      min_iters: int, root_mode: str, root: int, algo: str | None):
    """Shrink (iters, warmup) so the size takes about ``budget`` seconds (same on all ranks)."""
    b = backend
    roots = roots_for(root_mode, root, step.n)
    est = float("inf")
    for _ in range(2):      # the first op may pay for connections and page faults
        b.barrier()
        t0 = time.perf_counter()
        b.op(step.collective, step.bufs, step.op, roots[0], algo)
        b.sync()
        est = min(est, time.perf_counter() - t0)
    est = float(np.max(b.allgather_floats([est])[:, 0]))
    est = max(est, 1e-7)
    new_iters = int(max(min_iters, min(iters, budget / est)))
    new_warmup = int(max(min(1, warmup), min(warmup, 0.2 * budget / est)))
    return new_iters, new_warmup


def run_size(backend, collective: str, size: int, dtype: str, op: str, *,
             iters: int | None = None, warmup: int | None = None, timing: str = "osu",
             root_mode: str = "fixed", root: int = 0, algo: str | None = None,
             do_validate: bool = False, corrupt_rank: int | None = None,
             time_budget: float | None = None, min_iters: int = 5,
             window: int = 64, modes: Modes = PLAIN) -> dict:
    """Benchmark one size on every rank; every rank returns the same row dict (``modes``:
    the optional measurements, each adding its fields to the row)."""
    b = backend
    n = b.world_size
    spec = C.SPECS[collective]
    _check_root(collective, root, n)
    di, dx = default_iterations(collective, size)
    iters = di if iters is None else iters
    warmup = dx if warmup is None else warmup
    if spec.rma is not None:
        return _run_one_sided(b, collective, size, dtype, iters=iters, warmup=warmup,
                              do_validate=do_validate, corrupt_rank=corrupt_rank,
                              time_budget=time_budget, min_iters=min_iters, window=window,
                              modes=modes)
    if spec.pt2pt:
        return _run_pt2pt(b, collective, size, dtype, iters=iters, warmup=warmup,
                          do_validate=do_validate, corrupt_rank=corrupt_rank,
                          time_budget=time_budget, min_iters=min_iters, window=window,
                          modes=modes)
    # --nonblocking W: W calls in flight, each on its own buffers
    steps = [Step(b, collective, size, dtype, op) for _ in range(max(1, modes.nonblocking))]
    step = steps[0]
    roots = roots_for(root_mode, root, n)
    extra: dict = {}
    tally = None
    try:
        if time_budget is not None:
            iters, warmup = budget_iterations(b, step, iters, warmup,
                                              time_budget / modes.time_factor(), min_iters,
                                              root_mode, root, algo)
        if modes.nonblocking:
            times, means = measure_nonblocking(b, steps, iters, warmup, roots, algo)
            extra.update(overlap_fields(b.allgather_floats(means), modes.nonblocking))
        elif modes.check_every:
            times, tally = measure_checked(b, step, iters, warmup, modes.check_every, roots,
                                           algo, corrupt_rank)
        else:
            times = measure(b, step, iters, warmup, timing, root_mode, root, algo)
        wrong = (validate(b, step, root_mode, root, algo, corrupt_rank)
                 if do_validate and tally is None else 0)
    finally:
        for s in steps:
            s.free()
    if tally is not None:
        extra.update(check_fields(b.allgather_floats(tally_floats(tally)), modes.check_every))
    if modes.percentiles:
        extra.update(tail_fields(b, times))
    if modes.memory:
        extra.update(measure_memory(b))
    mean_us = float(times.mean() * 1e6)
    p50 = _percentile(times, 50) * 1e6
    p99 = _percentile(times, 99) * 1e6
    stats = b.allgather_floats([mean_us, float(wrong), p50, p99, float(times.min() * 1e6),
                                float(times.max() * 1e6)])
    avg = float(stats[:, 0].mean())
    total_wrong = int(stats[:, 1].sum())
    lay = step.layout
    nbytes = lay.nbytes
    algbw = nbytes / (avg * 1e-6) / 1e9 if avg > 0 else 0.0
    return {
        "library": b.name, "collective": collective, "ranks": n,
        "size": nbytes, "requested_size": size, "count": lay.count, "dtype": dtype,
        "op": op if spec.reduction else None,
        "root": (root if root_mode == "fixed" else "rotate") if spec.rooted else -1,
        "algorithm": b.selected_algorithm(collective, nbytes, algo),
        "timing": timing, "iterations": iters, "warmup": warmup,
        "avg_us": avg, "min_us": float(stats[:, 0].min()), "max_us": float(stats[:, 0].max()),
        "p50_us": float(stats[0, 2]), "p99_us": float(stats[0, 3]),
        "iter_min_us": float(stats[:, 4].min()), "iter_max_us": float(stats[:, 5].max()),
        "algbw_GBps": algbw, "busbw_GBps": algbw * spec.factor(n),
        "validation": (("Pass" if total_wrong == 0 else "Fail") if do_validate else None),
        "wrong": total_wrong if do_validate else None,
        **extra,        # after validation/wrong: --check-every's verdict replaces -c's
    }


def _run_pt2pt(b, collective: str, size: int, dtype: str, *, iters: int, warmup: int,
               do_validate: bool, corrupt_rank: int | None, time_budget: float | None,
               min_iters: int, window: int, modes: Modes) -> dict:
    """osu_latency (ping-pong, one-way = total / 2 iters) and osu_bw (window of sends)."""
    n = b.world_size
    if n < 2:
        raise BenchError(f"{collective} needs at least 2 ranks")
    lay = C.layout(collective, size, dtype, n)
    cd = C.compute_dtype(dtype)
    sbuf = b.alloc(lay.count, dtype)
    rbuf = b.alloc(lay.count, dtype)
    ack = b.alloc(1, "int8") if collective == "bw" else None
    b.write(sbuf, np.ones(lay.count, dtype=cd))
    b.write(rbuf, np.zeros(lay.count, dtype=cd))
    me = b.rank
    perf = time.perf_counter

    def one_round():
        if collective == "latency":
            if me == 0:
                b.send(sbuf, 1)
                b.recv(rbuf, 1)
            elif me == 1:
                b.recv(rbuf, 0)
                b.send(sbuf, 0)
        else:
            if me == 0:
                for _ in range(window):
                    b.send(sbuf, 1)
                b.recv(ack, 1)
            elif me == 1:
                for _ in range(window):
                    b.recv(rbuf, 0)
                b.send(ack, 0)

    if time_budget is not None:
        b.barrier()
        t0 = perf()
        one_round()
        est = float(np.max(b.allgather_floats([perf() - t0])[:, 0]))
        est = max(est, 1e-7)
        iters = int(max(min_iters, min(iters, time_budget / est)))
        warmup = int(max(min(1, warmup), min(warmup, 0.2 * time_budget / est)))
    b.barrier()
    for _ in range(warmup):
        one_round()
    b.barrier()
    t0 = perf()
    for _ in range(iters):
        one_round()
    elapsed = perf() - t0
    b.barrier()
    wrong = 0
    if do_validate:
        if me == 0:
            b.write(sbuf, C.pattern(0, lay.count, dtype))
            b.send(sbuf, 1)
            if collective == "latency":
                b.write(rbuf, np.zeros(lay.count, dtype=cd))
                b.recv(rbuf, 1)
                got = np.asarray(b.read(rbuf)).reshape(-1)
                if corrupt_rank == 0:
                    got = C.corrupt(got)
                wrong += C.count_wrong(got, C.pattern(1, lay.count, dtype))
        elif me == 1:
            b.write(rbuf, np.zeros(lay.count, dtype=cd))
            b.recv(rbuf, 0)
            got = np.asarray(b.read(rbuf)).reshape(-1)
            if corrupt_rank == 1:
                got = C.corrupt(got)
            wrong += C.count_wrong(got, C.pattern(0, lay.count, dtype))
            if collective == "latency":
                b.write(sbuf, C.pattern(1, lay.count, dtype))
                b.send(sbuf, 0)
        b.barrier()
    stats = b.allgather_floats([elapsed, float(wrong)])
    extra = measure_memory(b) if modes.memory else {}
    elapsed0 = float(stats[0, 0])
    total_wrong = int(stats[:, 1].sum())
    nbytes = lay.nbytes
    if collective == "latency":
        lat = elapsed0 / (2 * iters) * 1e6
        algbw = nbytes / (lat * 1e-6) / 1e9 if lat > 0 else 0.0
        bw_mbs = None
    else:
        lat = elapsed0 / (iters * window) * 1e6     # time per message
        bw_mbs = nbytes / 1e6 * iters * window / elapsed0 if elapsed0 > 0 else 0.0
        algbw = bw_mbs / 1e3
    return {
        "library": b.name, "collective": collective, "ranks": n,
        "size": nbytes, "requested_size": size, "count": lay.count, "dtype": dtype,
        "op": None, "root": -1, "algorithm": None, "timing": "osu",
        "iterations": iters, "warmup": warmup, "window": window if collective == "bw" else None,
        "avg_us": lat, "min_us": lat, "max_us": lat, "p50_us": None, "p99_us": None,
        "iter_min_us": None, "iter_max_us": None,
        "algbw_GBps": algbw, "busbw_GBps": algbw, "bandwidth_MBps": bw_mbs,
        "validation": (("Pass" if total_wrong == 0 else "Fail") if do_validate else None),
        "wrong": total_wrong if do_validate else None,
        **extra,
    }


def _run_one_sided(b, collective: str, size: int, dtype: str, *, iters: int, warmup: int,
                   do_validate: bool, corrupt_rank: int | None, time_budget: float | None,
                   min_iters: int, window: int, modes: Modes) -> dict:
    """OSU's one-sided tests with flush synchronisation (``osu_put_latency -s flush``...):
    rank 0 (and rank 1 for bibw) locks the peer's window, then per iteration issues one
    operation (latency) or ``window`` of them at distinct offsets (bw, bibw) and flushes;
    the other ranks wait in the closing barrier (a target over tcp serves from there)."""
    n = b.world_size
    if n < 2:
        raise BenchError(f"{collective} needs at least 2 ranks")
    if not hasattr(b, "window"):
        raise BenchError(f"{b.name} has no one-sided windows in this runner")
    kind, test = C.SPECS[collective].rma  # type: ignore[misc]
    lay = C.layout(collective, size, dtype, n)
    count = lay.count
    cd = C.compute_dtype(dtype)
    per = 1 if test == "latency" else window
    local = b.alloc(count * per, dtype)
    b.write(local, np.ones(count * per, dtype=cd))
    allocated = getattr(b, "window_type", "create") == "allocate"
    if allocated:           # MPI_Win_allocate: the library's memory (OSU's default, -w)
        win, exposed = b.allocate_window(count * per, dtype)
    else:                   # MPI_Win_create on the benchmark's buffer
        exposed = b.alloc(count * per, dtype)
    b.write(exposed, np.zeros(count * per, dtype=cd))
    me = b.rank
    origin = me == 0 or (test == "bibw" and me == 1)
    peer = 1 - me if me < 2 else None
    parts = [local[j * count:(j + 1) * count] for j in range(per)]
    perf = time.perf_counter
    if not allocated:
        win = b.window(exposed)

    def one_round():
        for j in range(per):
            b.rma(kind, win, parts[j], peer, j * count)
        b.flush(win, peer)

    try:
        if origin:
            b.lock(win, peer)
        if time_budget is not None:
            b.barrier()
            t0 = perf()
            if origin:
                one_round()
            est = max(float(np.max(b.allgather_floats([perf() - t0])[:, 0])), 1e-7)
            iters = int(max(min_iters, min(iters, time_budget / est)))
            warmup = int(max(min(1, warmup), min(warmup, 0.2 * time_budget / est)))
        b.barrier()
        elapsed = 0.0
        if origin:
            for _ in range(warmup):
                one_round()
            t0 = perf()
            for _ in range(iters):
                one_round()
            elapsed = perf() - t0
        b.barrier()
        wrong = _check_one_sided(b, kind, test, win, local, exposed, count, count * per, cd,
                                 dtype, origin, peer, corrupt_rank) if do_validate else 0
        if origin:
            b.unlock(win, peer)
    finally:
        b.free_window(win)
    stats = b.allgather_floats([elapsed, float(wrong)])
    extra = measure_memory(b) if modes.memory else {}
    elapsed0 = float(stats[0, 0])
    total_wrong = int(stats[:, 1].sum())
    nbytes = lay.nbytes
    if test == "latency":
        lat = elapsed0 / iters * 1e6
        bw_mbs = None
        algbw = nbytes / (lat * 1e-6) / 1e9 if lat > 0 else 0.0
    else:
        moved = nbytes * per * iters * (2 if test == "bibw" else 1)
        lat = elapsed0 / (iters * per) * 1e6
        bw_mbs = moved / 1e6 / elapsed0 if elapsed0 > 0 else 0.0
        algbw = bw_mbs / 1e3
    return {
        "library": b.name, "collective": collective, "ranks": n,
        "size": nbytes, "requested_size": size, "count": count, "dtype": dtype,
        "op": "sum" if kind == "accumulate" else None, "root": -1, "algorithm": None,
        "timing": "osu", "synchronization": "flush",
        "window_type": "allocate" if allocated else "create",
        "iterations": iters, "warmup": warmup, "window": per if test != "latency" else None,
        "avg_us": lat, "min_us": lat, "max_us": lat, "p50_us": None, "p99_us": None,
        "iter_min_us": None, "iter_max_us": None,
        "algbw_GBps": algbw, "busbw_GBps": algbw, "bandwidth_MBps": bw_mbs,
        "validation": (("Pass" if total_wrong == 0 else "Fail") if do_validate else None),
        "wrong": total_wrong if do_validate else None,
        **extra,
    }


def _check_one_sided(b, kind: str, test: str, win, local, exposed, count: int, total: int,
                     cd, dtype: str, origin: bool, peer: int | None,
                     corrupt_rank: int | None) -> int:
    """Once, after the timed loop: patterned data through one operation of the test's kind
    (an accumulate: two, onto zeros), checked where it landed. Returns wrong elements."""
    me = b.rank
    b.write(exposed, np.zeros(total, dtype=cd))
    if kind == "get":            # the target's data, read by the origin
        b.write(exposed[:count], C.pattern(me, count, dtype))
    b.barrier()
    if origin:
        b.write(local[:count], C.pattern(me, count, dtype))
        for _ in range(2 if kind == "accumulate" else 1):
            b.rma(kind, win, local[:count], peer, 0)
        b.flush(win, peer)
    b.barrier()
    checks = []
    if kind == "get":
        if origin:
            checks.append((local[:count], C.pattern(1 - me, count, dtype)))
    elif me == 1 or (me == 0 and test == "bibw"):      # what the peer put into me
        expected = C.pattern(1 - me, count, dtype)
        checks.append((exposed[:count], expected * 2 if kind == "accumulate" else expected))
    wrong = 0
    for buf, expected in checks:
        got = np.asarray(b.read(buf)).reshape(-1)
        if corrupt_rank == me:
            got = C.corrupt(got)
        wrong += C.count_wrong(got, expected)
    b.barrier()
    return wrong


def run_sweep(backend, collective: str, sizes: list[int], dtype: str, op: str, *,
              on_row: Callable[[dict], None] | None = None, progress: bool = False,
              stop_on_fail: bool = True, **kw) -> list[dict]:
    """Run every size (skipping sizes that round to an already measured byte count)."""
    rows = []
    seen = set()
    start = last_print = time.perf_counter()
    n = backend.world_size
    for i, size in enumerate(sizes):
        nbytes = C.layout(collective, size, dtype, n).nbytes
        if nbytes in seen:
            continue
        seen.add(nbytes)
        t0 = time.perf_counter()
        row = run_size(backend, collective, size, dtype, op, **kw)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        now = time.perf_counter()
        if progress and backend.rank == 0 and now - start > 2.0 and \
                (now - t0 > 2.0 or now - last_print > 10.0):
            last_print = now
            print(f"[pycoll.bench] {collective} {dtype} {row['size']} B done in "
                  f"{now - t0:.1f} s ({i + 1}/{len(sizes)} sizes, {now - start:.0f} s total)",
                  file=sys.stderr, flush=True)
        if stop_on_fail and row.get("validation") == "Fail":
            break
    return rows
