"""Output of ``python -m pycoll.bench``: OSU tables, nccl-tests tables, JSON lines, JSON, CSV,
and parsers for the two table formats (used by the tests and handy for scripts).

OSU layout (OMB 7.4 ``print_only_header``/``print_stats`` in ``c/util/osu_util.c``)::

    # Size       Avg Latency(us)     [Min Latency(us)     Max Latency(us)  Iterations]
    8                       1.52     ...

``"%-10s%18s"`` header, ``"%-10d%18.2f"`` rows (FIELD_WIDTH 18), 18-wide min/max, 12-wide
iterations; pycoll appends nccl-tests' ``algbw(GB/s)`` and ``busbw(GB/s)`` (14 wide) and,
with ``-c``, OSU's 18-wide ``Validation`` column last. nccl-tests layout: the header and
row printf formats of nccl-tests' ``src/util.cu``.
"""
from __future__ import annotations

import csv
import io
import json
import re

from .collectives import SPECS, measures_bandwidth
from .memory import FIELDS as MEMORY_FIELDS

FIELD_WIDTH = 18          # OMB osu_util.h FIELD_WIDTH (header "# Size       Avg Latency(us)")
BW_WIDTH = 14
D2D_WIDTH = 10            # the -d cuda "%d2d" column (busbw as a percentage of D2D copy)
OSU_VERSION = "7.4"

#: columns of the optional measurements (``options.Modes.columns``), in this order after
#: busbw (and %d2d), before Validation: (row field, header, scale applied for the table)
EXTRA_COLUMNS: dict[str, tuple[tuple[str, str, float], ...]] = {
    "nonblocking": (("overall_us", "Overall(us)", 1.0), ("compute_us", "Compute(us)", 1.0),
                    ("pure_comm_us", "Pure Comm.(us)", 1.0), ("overlap_pct", "Overlap(%)", 1.0)),
    "percentiles": (("tail_p50_us", "P50 Latency(us)", 1.0),
                    ("tail_p99_us", "P99 Latency(us)", 1.0),
                    ("tail_max_us", "Max Iter(us)", 1.0)),
    "memory": (("peak_rss_bytes_max", "Peak RSS(MiB)", 2.0 ** -20),
               ("segment_bytes_max", "Segments(MiB)", 2.0 ** -20),
               ("registered_bytes_max", "Registered(MiB)", 2.0 ** -20)),
}

NCCL_TYPES = {"float32": "float", "float64": "double", "float16": "half",
              "bfloat16": "bfloat16", "int8": "int8", "uint8": "uint8",
              "int32": "int32", "int64": "int64"}


# ---------------------------------------------------------------------------
# OSU format
# ---------------------------------------------------------------------------
def osu_preamble(meta: dict) -> list[str]:
    """Title and '#' description lines printed once before the first table."""
    spec = SPECS[meta["collective"]]
    lines = ["", f"# pycoll {spec.osu_title} (OSU Micro-Benchmarks {OSU_VERSION} format) "
                 f"{meta.get('library', 'pycoll')} {meta.get('version', '')}".rstrip()]
    lines += _meta_lines(meta)
    if "d2d_copy_GBps" in meta:
        lines.append("# %d2d = busbw / D2D copy x 100 (the GPU copying within its own memory "
                     "is the ceiling)")
    return lines


def _device_text(meta: dict) -> str:
    """'cpu', or 'cuda (cuda:0, cuda:1 NVIDIA H100 80GB HBM3)' with -d cuda."""
    dev = meta.get("device", "cpu")
    gpus = meta.get("gpus")
    if not gpus:
        return dev
    by_name: dict[str, list[str]] = {}
    for g in gpus:
        idx, _, name = g.partition(" ")
        by_name.setdefault(name, [])
        if idx not in by_name[name]:
            by_name[name].append(idx)
    return f"{dev} (" + "; ".join(f"{', '.join(ix)} {nm}".rstrip()
                                  for nm, ix in by_name.items()) + ")"


def d2d_line(meta: dict) -> str:
    """'# D2D copy: 1523.45 GB/s (...)': the ceiling measured in this run (-d cuda)."""
    from .options import format_size
    info = meta.get("d2d_copy") or {}
    g = meta.get("d2d_copy_GBps")
    if g is None:
        return f"# D2D copy: not measured ({info.get('error') or 'unknown reason'})"
    per = info.get("per_rank_GBps") or []
    spread = (f"; slowest of {len(per)} ranks, fastest {max(per):.2f}" if len(per) > 1 else "")
    return (f"# D2D copy: {g:.2f} GB/s (dst.copy_(src) of {format_size(int(info.get('bytes', 0)))}"
            f" within the rank's GPU, median of {info.get('reps', '?')}{spread}; "
            f"bytes copied / time)")


def _meta_lines(meta: dict) -> list[str]:
    spec = SPECS[meta["collective"]]
    timing = {"osu": "osu (each op timed, untimed barrier between ops)",
              "nccl": "nccl (ops back to back, total / iterations)"}[meta.get("timing", "osu")]
    parts = [f"Ranks: {meta['ranks']}", f"Device: {_device_text(meta)}"]
    if spec.rooted:
        parts.append(f"Root: {meta.get('root', 0)}")
    if spec.rma is not None:
        timing = "osu (the origin's loop of iterations, total / iterations)"
    parts.append(f"Timing: {timing}")
    lines = ["# " + "  ".join(parts)]
    lines.append(f"# Transport: {meta.get('transport') or 'unknown'}")
    if not spec.pt2pt:
        lines.append(f"# Algorithm: {meta.get('algorithm') or 'default'}")
    if spec.rma is not None:
        lines += rma_lines(meta)
    elif meta["collective"] == "bw":
        lines.append(f"# Window size: {meta.get('window', 64)}; Bandwidth in MB/s (1 MB = 1e6 B)")
    else:
        lines.append(f"# algbw = size / avg latency, busbw = algbw * {spec.factor_text}; "
                     f"GB/s with 1 GB = 1e9 B (nccl-tests)")
    if meta["collective"] == "barrier":
        lines.append("# Size is 0 for barrier")
    lines += _mode_lines(meta)
    if "d2d_copy_GBps" in meta:
        lines.append(d2d_line(meta))
    return lines


def rma_lines(meta: dict) -> list[str]:
    """The one-sided tests' lines, named as OSU names them (``# Window creation:``,
    ``# Synchronization:``)."""
    op, kind = SPECS[meta["collective"]].rma  # type: ignore[misc]
    created = ("comm.window (the rank's own buffer, as MPI_Win_create)"
               if meta.get("window_type") == "create"
               else "comm.allocate_window (pycoll's memory, as MPI_Win_allocate)")
    lines = [f"# Window creation: {created}",
             f"# Synchronization: {meta.get('synchronization', 'flush')}"]
    if kind == "latency":
        lines.append(f"# Latency: one {op} then a flush, per iteration; rank 0 is the "
                     "origin, rank 1 the target")
    else:
        both = "ranks 0 and 1 each" if kind == "bibw" else "rank 0"
        lines.append(f"# Window size: {meta.get('window', 64)} {op}s then a flush, by {both}; "
                     "Bandwidth in MB/s (1 MB = 1e6 B)")
    if op == "accumulate":
        lines.append("# Op: sum")
    return lines


def _mode_lines(meta: dict) -> list[str]:
    """One line per optional measurement in use (none without their flags)."""
    lines = []
    if meta.get("nonblocking"):
        n = meta["nonblocking"]
        lines.append(f"# Non-blocking: {n} call{'s' if n != 1 else ''} posted (async_op=True), "
                     "then waited; Avg Latency = Pure Comm. / calls; Overlap(%) = "
                     "100 * (1 - (Overall - Compute) / Pure Comm.); means over ranks")
    if meta.get("percentiles"):
        lines.append("# Percentiles: of each timed iteration's slowest rank (P50, P99, Max Iter)")
    if meta.get("check_every"):
        n = meta["check_every"]
        which = "every iteration" if n == 1 else f"every {n}th iteration"
        lines.append(f"# Check: patterned data before each iteration, {which} checked after "
                     "(both untimed)")
    if meta.get("memory"):
        lines.append("# Memory: peak RSS (VmHWM), shared segments and registered bytes, "
                     "MiB, max over ranks (min and max in --json)")
    return lines


def osu_block_header(collective: str, dtype: str, op: str | None, full: bool,
                     validate: bool, show_op: bool = False, d2d: bool = False,
                     extras: tuple[str, ...] = ()) -> list[str]:
    lines = [f"# Datatype: {dtype}."]
    if show_op and op:
        lines.append(f"# Op: {op}.")
    return lines + [osu_column_header(collective, full, validate, d2d, extras)]


def osu_column_header(collective: str, full: bool, validate: bool, d2d: bool = False,
                      extras: tuple[str, ...] = ()) -> str:
    """OSU's header; ``d2d`` (-d cuda) adds ``%d2d`` and ``extras`` (``EXTRA_COLUMNS``
    groups) add theirs, before Validation (which stays last)."""
    latency = collective == "latency" or SPECS[collective].rma is not None
    bandwidth = measures_bandwidth(collective)
    if bandwidth:
        h = f"{'# Size':<10}{'Bandwidth (MB/s)':>{FIELD_WIDTH}}"
    elif latency:
        h = f"{'# Size':<10}{'Latency (us)':>{FIELD_WIDTH}}"
    else:
        h = f"{'# Size':<10}{'Avg Latency(us)':>{FIELD_WIDTH}}"
        if full:
            h += f"{'Min Latency(us)':>{FIELD_WIDTH}}{'Max Latency(us)':>{FIELD_WIDTH}}"
            h += f"{'Iterations':>12}"
    if not bandwidth:
        h += f"{'algbw(GB/s)':>{BW_WIDTH}}{'busbw(GB/s)':>{BW_WIDTH}}"
    if d2d:
        h += f"{'%d2d':>{D2D_WIDTH}}"
    for group in extras:
        h += "".join(f"{title:>{FIELD_WIDTH}}" for _, title, _ in EXTRA_COLUMNS[group])
    if validate:
        h += f"{'Validation':>{FIELD_WIDTH}}"
    return h


def pct_text(pct) -> str:
    """The %d2d cell: '12.34', '0.00', or 'N/A' without a ceiling."""
    return "N/A" if pct is None else f"{pct:.2f}"


def _extra_cell(value, scale: float) -> str:
    return f"{'N/A':>{FIELD_WIDTH}}" if value is None else f"{value * scale:>{FIELD_WIDTH}.2f}"


def osu_row(row: dict, full: bool, validate: bool, extras: tuple[str, ...] = ()) -> str:
    """One OSU row; a row marked for -d cuda (``busbw_pct_d2d``) gets the %d2d cell."""
    c = row["collective"]
    if measures_bandwidth(c):
        s = f"{row['size']:<10d}{row['bandwidth_MBps']:>{FIELD_WIDTH}.2f}"
    else:
        s = f"{row['size']:<10d}{row['avg_us']:>{FIELD_WIDTH}.2f}"
        if full and not SPECS[c].pt2pt:
            s += f"{row['min_us']:>{FIELD_WIDTH}.2f}{row['max_us']:>{FIELD_WIDTH}.2f}"
            s += f"{row['iterations']:>12d}"
        s += f"{row['algbw_GBps']:>{BW_WIDTH}.4f}{row['busbw_GBps']:>{BW_WIDTH}.4f}"
    if "busbw_pct_d2d" in row:
        s += f"{pct_text(row['busbw_pct_d2d']):>{D2D_WIDTH}}"
    for group in extras:
        s += "".join(_extra_cell(row.get(key), scale) for key, _, scale in EXTRA_COLUMNS[group])
    if validate:
        s += f"{row.get('validation') or 'N/A':>{FIELD_WIDTH}}"
    return s


def summary_lines(rows: list[dict]) -> list[str]:
    """nccl-tests' closing lines (comments, so OSU parsers skip them)."""
    wrong = sum(r["wrong"] or 0 for r in rows if r.get("wrong") is not None)
    checked = any(r.get("wrong") is not None for r in rows)
    avg_bus = sum(r["busbw_GBps"] for r in rows) / len(rows) if rows else 0.0
    lines = [f"# Out of bounds values : {wrong if checked else 0} "
             f"{'OK' if wrong == 0 else 'FAILED'}",
             f"# Avg bus bandwidth    : {avg_bus:g}"]
    return lines + d2d_summary(rows)


def d2d_summary(rows: list[dict]) -> list[str]:
    """-d cuda: '# Peak bus bandwidth   : 21.3 GB/s at 1MiB = 1.40% of D2D copy 1523.45 GB/s'."""
    from .options import format_size
    marked = [r for r in rows if r.get("d2d_copy_GBps")]
    if not marked:
        return []
    best = max(marked, key=lambda r: r["busbw_GBps"])
    return [f"# Peak bus bandwidth   : {best['busbw_GBps']:g} GB/s at "
            f"{format_size(best['size'])} = {pct_text(best.get('busbw_pct_d2d'))}% of "
            f"D2D copy {best['d2d_copy_GBps']:.2f} GB/s"]


# ---------------------------------------------------------------------------
# nccl-tests format
# ---------------------------------------------------------------------------
def nccl_preamble(meta: dict, sizes: list[int]) -> list[str]:
    spec = SPECS[meta["collective"]]
    name = spec.nccl_name
    lines = [f"# pycoll.bench in nccl-tests format: {meta.get('library', 'pycoll')} "
             f"{meta.get('version', '')}".rstrip(),
             f"# Collective test starting: {name}",
             f"# nThread 1 nGpus 1 minBytes {min(sizes) if sizes else 0} "
             f"maxBytes {max(sizes) if sizes else 0} step: 2(factor) "
             f"warmup iters: {meta.get('warmup_text', 'osu')} "
             f"iters: {meta.get('iters_text', 'osu')} "
             f"agg iters: 1 validation: {1 if meta.get('validate') else 0} graph: 0",
             "#"]
    lines += _meta_lines(meta)
    lines += ["#", "# Using devices"]
    gpus = meta.get("gpus") or []
    for r, (pid, host) in enumerate(meta.get("pids", [])):
        if r < len(gpus):       # -d cuda: 'cuda:1 NVIDIA H100 80GB HBM3'
            idx, _, name = gpus[r].partition(" ")
            dev = f"device {int(idx.split(':')[1]):2d} [{idx}] {name}"
        else:
            dev = f"device  0 [{meta.get('device', 'cpu')}] {meta.get('device', 'cpu')}"
        lines.append(f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10s} {dev}")
    lines.append("#")
    return lines


def nccl_column_header() -> list[str]:
    return [
        "#" + " " * 61 + "in-place",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'time':>7}  "
        f"{'algbw':>6}  {'busbw':>6}  {'#wrong':>6}",
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'(us)':>7}  "
        f"{'(GB/s)':>6}  {'(GB/s)':>6}  {'':>5}",
    ]


def _nccl_time(us: float) -> str:
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def nccl_row(row: dict) -> str:
    root = row.get("root", -1)
    root = 0 if root == "rotate" else int(root)
    wrong = "N/A" if row.get("wrong") is None else str(row["wrong"])
    dtype = NCCL_TYPES.get(row["dtype"], row["dtype"])
    op = row.get("op") or "none"
    return (f"{row['size']:12d}  {row['count']:12d}  {dtype:>8}  {op:>6}  {root:6d}  "
            f"{_nccl_time(row['avg_us'])}  {row['algbw_GBps']:6.2f}  {row['busbw_GBps']:6.2f}  "
            f"{wrong:>6}")


def nccl_epilogue(meta: dict, rows: list[dict]) -> list[str]:
    return summary_lines(rows) + ["#", f"# Collective test concluded: "
                                       f"{SPECS[meta['collective']].nccl_name}", ""]


# ---------------------------------------------------------------------------
# JSON / CSV
# ---------------------------------------------------------------------------
CSV_FIELDS = ["library", "collective", "ranks", "size", "requested_size", "count", "dtype",
              "op", "root", "algorithm", "timing", "iterations", "warmup", "avg_us", "min_us",
              "max_us", "p50_us", "p99_us", "iter_min_us", "iter_max_us", "algbw_GBps",
              "busbw_GBps", "bandwidth_MBps", "validation", "wrong", "d2d_copy_GBps",
              "busbw_pct_d2d"]
#: the optional measurements' fields (rows carry them only with their flags)
OPTIONAL_FIELDS = ["nonblocking", "overall_us", "compute_us", "pure_comm_us", "overlap_pct",
                   "tail_p50_us", "tail_p99_us", "tail_max_us", "check_every",
                   "checked_iterations", "failed_checks", "first_bad_iteration",
                   *(f"{stem}_{end}" for stem, _ in MEMORY_FIELDS for end in ("min", "max")),
                   "compress", "wire_bytes", "max_abs_err", "err_over_bound"]


def jsonl_row(row: dict) -> str:
    return json.dumps(row, sort_keys=True)


def write_json(path: str, meta: dict, rows: list[dict]) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1, sort_keys=True)
        f.write("\n")


def csv_text(rows: list[dict]) -> str:
    """``CSV_FIELDS``, then the optional measurements' fields that some row carries."""
    fields = CSV_FIELDS + [k for k in OPTIONAL_FIELDS if any(k in r for r in rows)]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    return buf.getvalue()



def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        f.write(csv_text(rows))


# ---------------------------------------------------------------------------
# parsers
# ---------------------------------------------------------------------------
def _num(tok: str):
    try:
        return int(tok)
    except ValueError:
        pass
    try:
        return float(tok)
    except ValueError:
        return tok


def parse_osu(text: str) -> list[dict]:
    """Parse OSU-style output into row dicts keyed by column names ('Size', 'Avg Latency(us)'...).

    Works on real OMB output too: '#' lines are comments except the column header, which is
    the one that starts with '# Size' (or '# Avg Latency' for osu_barrier).
    """
    cols = None
    rows = []
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            body = s[1:].strip()
            if body.startswith("Size") or body.startswith("Avg Latency"):
                cols = re.split(r"\s{2,}", body)
            continue
        if cols is None:
            continue
        toks = s.split()
        if len(toks) != len(cols):
            raise ValueError(f"OSU row has {len(toks)} fields, header has {len(cols)}: {line!r}")
        rows.append({c: _num(t) for c, t in zip(cols, toks)})
    return rows


NCCL_COLS = ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"]


def parse_nccl(text: str) -> dict:
    """Parse nccl-tests output: {'rows': [...], 'avg_busbw': float, 'oob': int}.

    Rows carry the out-of-place (or only) group as time/algbw/busbw/#wrong and, when present,
    the in-place group as ip_time/ip_algbw/ip_busbw/ip_#wrong.
    """
    rows = []
    avg = oob = None
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = re.match(r"#\s*Avg bus bandwidth\s*:\s*(\S+)", s)
            if m:
                avg = float(m.group(1))
            m = re.match(r"#\s*Out of bounds values\s*:\s*(\d+)", s)
            if m:
                oob = int(m.group(1))
            continue
        toks = s.split()
        if len(toks) not in (9, 13) or not toks[0].isdigit():
            continue
        row = {c: _num(t) for c, t in zip(NCCL_COLS, toks[:9])}
        if len(toks) == 13:
            for c, t in zip(NCCL_COLS[5:], toks[9:]):
                row["ip_" + c] = _num(t)
        rows.append(row)
    return {"rows": rows, "avg_busbw": avg, "oob": oob}
