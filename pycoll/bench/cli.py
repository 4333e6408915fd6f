"""``python -m pycoll.bench``: parse flags, (re)launch ranks, run, print, write files."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import sys

from . import collectives as C
from . import report
from .backend import cuda_unavailable_reason
from .options import Options, format_size, parse_args
from .runner import BenchError, run_sweep

# Environment that marks a process started by a launcher (pycoll.run, torchrun, mpiexec).
LAUNCHER_ENV = (
    ("PYCOLL_RANK",),
    ("RANK", "WORLD_SIZE"),            # torchrun, pycoll.run
    ("PMI_RANK", "PMI_SIZE"),          # MPICH/Hydra, Intel MPI
    ("OMPI_COMM_WORLD_RANK",),         # Open MPI
    ("PMIX_RANK",),
)


def under_launcher(env=None) -> bool:
    """True when a launcher started this process (so pycoll.init() finds its rank)."""
    env = os.environ if env is None else env
    try:
        from pycoll.launch import detect_launch
    except ImportError:
        return any(all(k in env for k in keys) for keys in LAUNCHER_ENV)
    try:
        return detect_launch(env).launcher != "none"
    except ValueError:
        return True     # a launcher's variables are there but broken: let init() say why


def _relaunch(argv: list[str], nprocs: int) -> int:
    """Standalone run: start ``nprocs`` local ranks of this same command."""
    try:
        from pycoll.launch import launch
    except ImportError as e:
        print(f"pycoll.bench: cannot spawn local ranks ({e}); start it under a launcher, "
              f"e.g. python -m pycoll.run -n {nprocs} -m pycoll.bench ...", file=sys.stderr)
        return 2
    return int(launch(["-m", "pycoll.bench", *argv], nprocs) or 0)


def _algorithm_text(backend, collective: str, sizes: list[int], dtype: str, algo) -> str:
    """'ring (8B-1MiB)' / 'rd (8B-32KiB), ring (64KiB-1MiB)' / 'default'."""
    if algo:
        return f"{algo} (forced)"
    n = backend.world_size
    spans: list[list] = []
    seen = set()
    for s in sizes:
        nb = C.layout(collective, s, dtype, n).nbytes
        if nb in seen:
            continue
        seen.add(nb)
        a = backend.selected_algorithm(collective, nb, None)
        if spans and spans[-1][0] == a:
            spans[-1][2] = nb
        else:
            spans.append([a, nb, nb])
    if not spans or all(a is None for a, _, _ in spans):
        return "default (this pycoll does not report its selection)"
    return ", ".join(f"{a or '?'} ({format_size(lo)}-{format_size(hi)})" if lo != hi
                     else f"{a or '?'} ({format_size(lo)})" for a, lo, hi in spans)


def build_meta(opts: Options, backend, argv: list[str]) -> dict:
    import numpy as np
    it_small = opts.iterations_for(1)
    it_large = opts.iterations_for(1 << 20)
    meta = {
        "library": backend.name, "version": getattr(backend, "version", ""),
        "collective": opts.collective, "ranks": backend.world_size, "device": opts.device,
        "timing": opts.timing, "root": opts.root if opts.root_mode == "fixed" else "rotate",
        "transport": backend.transport(), "dtypes": opts.dtypes, "ops": opts.ops,
        "validate": opts.validate, "window": opts.window, "algo": opts.algo,
        "time_budget": opts.time_budget, "compress": opts.compress,
        "window_type": opts.window_type,
        "iters_text": (str(opts.iterations) if opts.iterations is not None
                       else f"{it_small[0]}/{it_large[0]}"),
        "warmup_text": (str(opts.warmup) if opts.warmup is not None
                        else f"{it_small[1]}/{it_large[1]}"),
        "argv": ["python", "-m", "pycoll.bench", *argv],
        "host": socket.gethostname(), "python": platform.python_version(),
        "numpy": np.__version__,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    if opts.label:
        meta["label"] = opts.label
    modes = opts.modes
    for key, value in (("percentiles", modes.percentiles), ("check_every", modes.check_every),
                       ("memory", modes.memory), ("nonblocking", modes.nonblocking)):
        if value:       # only with their flags: a run without them is described as before
            meta[key] = value
    return meta


def add_ceiling(meta: dict, ceiling: dict, devices: list | None = None) -> None:
    """Record the D2D copy ceiling (pycoll.bench.ceiling.measure_ceiling) in the run's meta."""
    meta["d2d_copy_GBps"] = ceiling["GBps"]
    meta["d2d_copy"] = {k: ceiling[k] for k in ("bytes", "reps", "copies", "per_rank_GBps",
                                                "error")}
    meta["d2d_copy"]["method"] = ("torch dst.copy_(src) on each rank's GPU, one rank at a "
                                  "time, CUDA events, median of reps; bytes copied / time; "
                                  "GBps = the slowest rank")
    if devices:
        meta["gpus"] = devices


def mark_row(row: dict, ceiling_gbps) -> dict:
    """Add the D2D ceiling and busbw as a percentage of it to one result row (-d cuda)."""
    from .ceiling import pct_of
    row["d2d_copy_GBps"] = ceiling_gbps
    row["busbw_pct_d2d"] = pct_of(row["busbw_GBps"], ceiling_gbps)
    return row


def _gpu_names(backend) -> list[str] | None:
    """Every rank's 'cuda:I name' (rank 0 names the indices; one host assumed as for pids)."""
    bufs = getattr(backend, "bufs", None)
    index = getattr(bufs, "device_index", None)
    if index is None:
        return None
    idx = backend.allgather_floats([float(index)])[:, 0]
    if backend.rank != 0:
        return None
    import torch
    return [f"cuda:{int(i)} {torch.cuda.get_device_name(int(i))}" for i in idx]


def run(opts: Options, argv: list[str]) -> int:
    from .backend import PycollBackend

    try:
        backend = PycollBackend(opts.device, opts.dtypes)
        backend.window_type = opts.window_type
    except BenchError as e:
        print(f"pycoll.bench: {e}", file=sys.stderr)
        return 2
    rank0 = backend.rank == 0
    out = sys.stdout

    def emit(lines):
        if rank0:
            for ln in ([lines] if isinstance(lines, str) else lines):
                print(ln, file=out)
            out.flush()

    rc = 0
    try:
        try:
            backend.check_algo(opts.collective, opts.algo)
            spec = C.SPECS[opts.collective]
            n = backend.world_size
            if spec.pt2pt and n < 2:
                raise BenchError(f"{opts.collective} needs at least 2 ranks (got {n})")
            if spec.rooted and opts.root_mode == "fixed" and opts.root >= n:
                raise BenchError(f"root {opts.root} out of range for {n} ranks")
        except BenchError as e:
            if rank0:
                print(f"pycoll.bench: {e}", file=sys.stderr)
            return 2
        sizes = [0] if opts.collective == "barrier" else opts.sizes()
        meta = build_meta(opts, backend, argv)
        if opts.compress:         # what the ranks' PYCOLL_COMPRESS runs, whatever the size
            meta["algorithm"] = f"compressed (compress={opts.compress})"
        elif not spec.pt2pt:
            meta["algorithm"] = _algorithm_text(backend, opts.collective, sizes,
                                                opts.dtypes[0], opts.algo)
        pids = backend.allgather_floats([float(os.getpid())])[:, 0]
        meta["pids"] = [(int(p), meta["host"]) for p in pids]
        ceiling_gbps = None
        if opts.device == "cuda":
            from .ceiling import measure_ceiling
            devices = _gpu_names(backend)
            top = max((C.layout(opts.collective, s, dt, n).nbytes
                       for s in sizes for dt in opts.dtypes), default=0)
            if top > 0:      # barrier moves no bytes: no ceiling to compare with
                ceiling = measure_ceiling(backend, top)
                add_ceiling(meta, ceiling, devices)
                ceiling_gbps = ceiling["GBps"]
            elif devices:
                meta["gpus"] = devices
        if opts.fmt == "osu":
            emit(report.osu_preamble(meta))
        elif opts.fmt == "nccl":
            nbytes = sorted({C.layout(opts.collective, s, opts.dtypes[0], n).nbytes
                             for s in sizes})
            emit(report.nccl_preamble(meta, nbytes))
            emit(report.nccl_column_header())
        all_rows: list[dict] = []
        failed = None
        ops = opts.ops if spec.reduction else [opts.ops[0]]
        extras = opts.modes.columns()
        for dtype in opts.dtypes:
            for op in ops:
                if opts.fmt == "osu":
                    emit(report.osu_block_header(opts.collective, dtype,
                                                 op if spec.reduction else None, opts.full,
                                                 opts.validate, show_op=len(ops) > 1,
                                                 d2d="d2d_copy_GBps" in meta,
                                                 extras=extras))

                def on_row(row):
                    if "d2d_copy_GBps" in meta:
                        mark_row(row, ceiling_gbps)
                    if opts.fmt == "osu":
                        emit(report.osu_row(row, opts.full, opts.validate, extras))
                    elif opts.fmt == "nccl":
                        emit(report.nccl_row(row))
                    else:
                        emit(report.jsonl_row(row))

                rows = run_sweep(
                    backend, opts.collective, sizes, dtype, op, on_row=on_row,
                    progress=not opts.quiet, iters=opts.iterations, warmup=opts.warmup,
                    timing=opts.timing, root_mode=opts.root_mode, root=opts.root,
                    algo=opts.algo, do_validate=opts.validate,
                    corrupt_rank=opts.corrupt_rank, time_budget=opts.time_budget,
                    min_iters=opts.min_iterations, window=opts.window, modes=opts.modes)
                all_rows.extend(rows)
                bad = [r for r in rows if r.get("validation") == "Fail"]
                if bad:
                    failed = bad[0]
                    break
            if failed:
                break
        if opts.compress and failed is None:
            from .compressed import error_table
            emit(error_table(backend.comm, opts.collective, sizes, opts.dtypes, all_rows,
                             opts.compress, opts.fmt != "jsonl"))
        if opts.fmt == "osu":
            emit(report.summary_lines(all_rows))
        elif opts.fmt == "nccl":
            emit(report.nccl_epilogue(meta, all_rows))
        if failed is not None:
            rc = 1
            if rank0:
                where = (f" (first failing iteration {failed['first_bad_iteration']}; the "
                         "ranks that found it said what above)"
                         if failed.get("first_bad_iteration") is not None else "")
                print(f"DATA VALIDATION ERROR: pycoll.bench {opts.collective} exited with "
                      f"status 1 on message size {failed['size']}{where}.", file=sys.stderr)
        if rank0:
            _write_files(opts, meta, all_rows)
    finally:
        try:
            backend.finalize()
        except Exception as e:   # a broken finalize must not hide the result
            print(f"pycoll.bench: finalize failed on rank {backend.rank}: {e}", file=sys.stderr)
    return rc


def _write_files(opts: Options, meta: dict, rows: list[dict]) -> None:
    if opts.json:
        report.write_json(opts.json, meta, rows)
    if opts.csv:
        report.write_csv(opts.csv, rows)
    if opts.plot:
        from .plot import plot_rows
        plot_rows(rows, opts.plot, title=f"pycoll {opts.collective}, {meta['ranks']} ranks")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(argv)
    if opts.transport:
        os.environ["PYCOLL_TRANSPORTS"] = opts.transport
    if opts.compress:           # every rank's communicator default: the timed calls compress
        os.environ["PYCOLL_COMPRESS"] = opts.compress
    if opts.device == "cuda":
        why = cuda_unavailable_reason()      # before any rank starts
        if why:
            print(f"pycoll.bench: {why}", file=sys.stderr)
            return 2
    if not under_launcher():
        return _relaunch(argv, opts.nprocs)
    return run(opts, argv)
