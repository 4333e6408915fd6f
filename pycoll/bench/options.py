"""Command-line options of ``python -m pycoll.bench``: flags, sizes, OSU defaults.

Sizes accept plain integers and binary suffixes: ``4K`` = 4096, ``512M`` = 512 MiB,
``1G`` = 1 GiB (``KB``/``KiB``/``k`` spellings too).  ``-m`` follows OSU: ``-m MAX``,
``-m MIN:MAX``, ``-m MIN:`` (sizes double from MIN to MAX).
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

# ---------------------------------------------------------------------------
# OSU Micro-Benchmarks 7.4 defaults (c/util/osu_util.h and osu_util.c in the OMB sources)
# ---------------------------------------------------------------------------
LARGE_MESSAGE_SIZE = 8192          # iteration counts switch above this size
MAX_MSG_SIZE_COLL = 1 << 20        # default -m for collectives
MAX_MSG_SIZE_PT2PT = 1 << 22       # default -m for latency/bw
DEFAULT_WINDOW = 64                # osu_bw window size

# (small iters, small warmup, large iters, large warmup)
OSU_ITERATIONS = {
    "coll": (1000, 100, 100, 10),
    "latency": (10000, 100, 1000, 10),
    "bw": (100, 10, 20, 2),
}

COLLECTIVES = (
    "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
    "alltoall", "gather", "scatter", "barrier", "latency", "bw",
    "put", "put_bw", "put_bibw", "get", "get_bw", "accumulate",
)
#: the point-to-point tests: two ranks, OSU's latency/bw iteration counts and sizes
PT2PT = ("latency", "bw", "put", "put_bw", "put_bibw", "get", "get_bw", "accumulate")
ALIASES = {
    "bcast": "broadcast", "all_reduce": "allreduce", "all_gather": "allgather",
    "reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter",
    "all_to_all": "alltoall", "osu_latency": "latency", "osu_bw": "bw",
    "osu_put_latency": "put", "osu_put_bw": "put_bw", "osu_put_bibw": "put_bibw",
    "osu_get_latency": "get", "osu_get_bw": "get_bw", "osu_acc_latency": "accumulate",
    "acc": "accumulate",
}
OPS = ("sum", "prod", "min", "max", "avg")

# dtype name -> numpy dtype name (None: torch-only type)
DTYPES = {
    "float32": "float32", "float64": "float64", "float16": "float16",
    "int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64",
    "bfloat16": None,
}
DTYPE_ALIASES = {
    "float": "float32", "f32": "float32", "fp32": "float32", "mpi_float": "float32",
    "double": "float64", "f64": "float64", "fp64": "float64", "mpi_double": "float64",
    "half": "float16", "f16": "float16", "fp16": "float16",
    "char": "int8", "mpi_char": "int8", "byte": "uint8", "mpi_byte": "uint8",
    "int": "int32", "mpi_int": "int32", "long": "int64", "mpi_long": "int64",
    "bf16": "bfloat16",
}
DTYPE_ALL = ("int8", "int32", "float32")   # what `-T all` loops over (OSU: char, int, float)

_SUFFIX = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"512M"`` -> 536870912.  Binary multiples; ``B``, ``KB``, ``KiB`` accepted."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"invalid size {text!r} (examples: 8, 4K, 512M, 1G)")
    number, suffix, _ = m.groups()
    return int(number) * _SUFFIX[suffix.lower()]


def parse_message_range(text: str, default_min: int, default_max: int) -> tuple[int, int]:
    """OSU ``-m``: ``MAX``, ``MIN:MAX``, ``MIN:`` or ``:MAX``."""
    text = str(text).strip()
    if ":" in text:
        lo, hi = text.split(":", 1)
        mn = parse_size(lo) if lo.strip() else default_min
        mx = parse_size(hi) if hi.strip() else default_max
    else:
        mn, mx = default_min, parse_size(text)
    if mn > mx:
        raise ValueError(f"message size range {text!r}: minimum {mn} > maximum {mx}")
    return mn, mx


def message_sizes(min_size: int, max_size: int) -> list[int]:
    """Sizes doubling from ``min_size`` (0 counts as 1 after itself, as OSU) up to ``max_size``."""
    sizes = []
    s = min_size
    if s == 0:
        sizes.append(0)
        s = 1
    while s <= max_size:
        sizes.append(s)
        s *= 2
    return sizes


def format_size(n: int) -> str:
    """4096 -> '4KiB', 536870912 -> '512MiB', 12 -> '12B'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def kind_of(collective: str) -> str:
    if collective in PT2PT:
        return "latency" if collective in ("latency", "put", "get", "accumulate") else "bw"
    return "coll"


def default_iterations(collective: str, size: int) -> tuple[int, int]:
    """OSU's (iterations, warm-up) for a message of ``size`` bytes."""
    small_i, small_x, large_i, large_x = OSU_ITERATIONS[kind_of(collective)]
    if size > LARGE_MESSAGE_SIZE:
        return large_i, large_x
    return small_i, small_x


def normalize_dtype(name: str) -> str:
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key != "all" and key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)} or all")
    return key


def parse_root(text: str) -> tuple[str, int]:
    """OSU ``-k``: ``R``, ``fixed:R`` or ``rotate``.  Returns (mode, root)."""
    t = str(text).strip().lower()
    if t == "rotate":
        return "rotate", 0
    if t.startswith("fixed:"):
        t = t[len("fixed:"):]
    try:
        r = int(t)
    except ValueError:
        raise ValueError(f"invalid root {text!r} (use R, fixed:R or rotate)") from None
    if r < 0:
        raise ValueError(f"invalid root {text!r}: must be >= 0")
    return "fixed", r


@dataclass(frozen=True)
class Modes:
    """The optional measurements, each off by default (the plain loop is untouched then):
    ``-P`` percentiles over iterations, ``--check-every N``, ``--memory``, ``--nonblocking W``.
    """

    percentiles: bool = False
    check_every: int = 0            # 0: off; N: check every N-th iteration
    memory: bool = False
    nonblocking: int = 0            # 0: blocking calls; W: window of async calls

    def time_factor(self) -> int:
        """How many times the plain loop's work one size takes (``--time-budget``): the
        non-blocking mode runs its iterations twice, W calls each."""
        return 2 * self.nonblocking if self.nonblocking else 1

    def columns(self) -> tuple[str, ...]:
        """The groups of table columns these modes add (``report.EXTRA_COLUMNS``)."""
        return tuple(name for name, on in (("nonblocking", self.nonblocking),
                                           ("percentiles", self.percentiles),
                                           ("memory", self.memory)) if on)


#: no optional measurement: the plain loop
PLAIN = Modes()


@dataclass
class Options:
    collective: str
    min_size: int
    max_size: int
    iterations: int | None          # None: OSU default per size
    warmup: int | None
    full: bool
    dtypes: list[str]
    ops: list[str]
    validate: bool
    root_mode: str                  # fixed | rotate
    root: int
    nprocs: int
    algo: str | None
    transport: str | None
    device: str
    json: str | None
    csv: str | None
    plot: str | None
    fmt: str                        # osu | nccl | jsonl
    timing: str                     # osu | nccl
    window: int
    time_budget: float | None
    min_iterations: int
    quiet: bool
    corrupt_rank: int | None
    label: str | None
    modes: Modes = PLAIN
    compress: str | None = None     # --compress: the wire format (PYCOLL_COMPRESS in the ranks)
    window_type: str = "allocate"   # -w: one-sided tests' window memory (allocate | create)

    def sizes(self) -> list[int]:
        return message_sizes(self.min_size, self.max_size)

    def iterations_for(self, size: int) -> tuple[int, int]:
        i, x = default_iterations(self.collective, size)
        return (self.iterations if self.iterations is not None else i,
                self.warmup if self.warmup is not None else x)


class _Parser(argparse.ArgumentParser):
    """argparse exits with status 2 and a usage line on any error; keep that."""


def build_parser(prog: str = "python -m pycoll.bench") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="OSU-style micro-benchmarks for pycoll with nccl-tests algbw/busbw.",
        epilog="Sizes accept 8, 4K, 512M, 1G (binary multiples). "
               "Example: python -m pycoll.bench allreduce -n 2 -m 8:16M -c -f",
    )
    p.add_argument("collective", help="one of: " + ", ".join(COLLECTIVES))
    p.add_argument("-m", "--message-size", metavar="[MIN:]MAX", default=None,
                   help="message sizes (default 1:1M for collectives, 0:4M for latency/bw, "
                        "1:4M for the one-sided tests)")
    p.add_argument("-i", "--iterations", type=int, default=None,
                   help="timed iterations (default: OSU's, fewer above 8 KiB)")
    p.add_argument("-x", "--warmup", type=int, default=None,
                   help="warm-up iterations (default: OSU's, fewer above 8 KiB)")
    p.add_argument("-f", "--full", action="store_true",
                   help="full statistics: min/max latency across ranks and iterations")
    p.add_argument("-T", "--type", dest="dtype", default="float32",
                   help="dtype: float32 (default), float64, float16, bfloat16, int8, uint8, "
                        "int32, int64, OSU's mpi_char/mpi_int/mpi_float, or all")
    p.add_argument("-c", "--validation", action="store_true",
                   help="validate results (adds a Validation column; exit 1 on failure)")
    p.add_argument("-k", "--root-rank", default="0",
                   help="root for rooted collectives: R, fixed:R or rotate (default 0)")
    p.add_argument("-n", "--nprocs", type=int, default=2,
                   help="local ranks to spawn when not started by a launcher (default 2)")
    p.add_argument("-A", "--algo", default=None, help="force an algorithm (passed as algo=)")
    p.add_argument("--transport", default=None,
                   help="force the transports, an ordered list such as verbs or verbs,tcp "
                        "(PYCOLL_TRANSPORTS)")
    p.add_argument("-o", "--op", default="sum",
                   help="reduction op: sum (default), prod, min, max, avg, or all")
    p.add_argument("-d", "--device", default="cpu", choices=("cpu", "cuda"),
                   help="buffer device: cpu (default) or cuda (torch CUDA tensors on GPU "
                        "local_rank %% device_count; also measures the GPU's device-to-device "
                        "copy bandwidth and reports busbw as %%d2d of it)")
    p.add_argument("--json", metavar="FILE", default=None, help="write results as JSON")
    p.add_argument("--csv", metavar="FILE", default=None, help="write results as CSV")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="plot latency and busbw against size (needs matplotlib)")
    p.add_argument("--format", dest="fmt", default="osu", choices=("osu", "nccl", "jsonl"),
                   help="table format on stdout: osu (default), nccl (nccl-tests), jsonl")
    p.add_argument("--timing", default="osu", choices=("osu", "nccl"),
                   help="osu: time each op, barrier between ops (default); "
                        "nccl: ops back to back, total / iterations")
    p.add_argument("-W", "--window-size", dest="window", type=int, default=DEFAULT_WINDOW,
                   help="messages in flight per round in the bw tests (bw, put_bw, put_bibw, "
                        "get_bw: operations between flushes; default 64)")
    p.add_argument("-w", "--window-type", default="allocate", choices=("allocate", "create"),
                   help="one-sided tests: the window's memory, as OSU's -w: allocate (the "
                        "library allocates it, MPI_Win_allocate / allocate_window; default) "
                        "or create (the benchmark's buffer, MPI_Win_create / window)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="cap timed iterations so each size takes about SECONDS "
                        "(estimated from a probe op; at least --min-iterations)")
    p.add_argument("--min-iterations", type=int, default=5,
                   help="lower bound on iterations with --time-budget (default 5)")
    p.add_argument("-P", "--percentiles", action="store_true",
                   help="per-iteration latency percentiles: p50, p99 and max of each "
                        "iteration's slowest rank (columns P50/P99 Latency(us), Max Iter(us))")
    p.add_argument("-C", "--check-every", type=int, default=0, metavar="N",
                   help="validate the timed loop itself: patterned data before every "
                        "iteration, checked after every N-th (1: all), both untimed; "
                        "adds the Validation column, exit 1 on a wrong result")
    p.add_argument("--memory", action="store_true",
                   help="per rank peak RSS and pycoll's shared-segment and registered bytes "
                        "(columns: max over ranks; --json has min and max)")
    p.add_argument("--nonblocking", type=int, default=0, metavar="W",
                   help="post W calls with async_op=True, then wait for all; adds OSU's "
                        "non-blocking columns Overall, Compute, Pure Comm. and Overlap(%%)")
    p.add_argument("--compress", default=None, choices=("bf16", "fp16", "fp8", "int8"),
                   help="compressed collectives (allreduce, reduce_scatter, allgather, "
                        "broadcast of floats): busbw on the uncompressed size, plus a table of "
                        "wire bytes and the measured max error against docs/numerics.md's bound")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--label", default=None, help=argparse.SUPPRESS)
    # Testing hook: corrupt this rank's result before validation (also env
    # PYCOLL_BENCH_CORRUPT_RANK).  Hidden from --help.
    p.add_argument("--corrupt-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def corrupt_rank_from_env() -> int | None:
    """``PYCOLL_BENCH_CORRUPT_RANK`` (testing hook), None when unset or empty.

    Raises :class:`pycoll.InvalidArgument` naming the variable unless it is an integer >= 0.
    """
    from pycoll.envvars import env_int

    value = env_int("PYCOLL_BENCH_CORRUPT_RANK", -1, minimum=0)
    return None if value < 0 else value


def parse_args(argv, prog: str = "python -m pycoll.bench") -> Options:
    """Parse and check the command line; errors exit with status 2 and a usage line."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    coll = ALIASES.get(ns.collective.lower(), ns.collective.lower())
    if coll not in COLLECTIVES:
        parser.error(f"unknown collective {ns.collective!r}; choose from {', '.join(COLLECTIVES)}")
    dmax = MAX_MSG_SIZE_PT2PT if coll in PT2PT else MAX_MSG_SIZE_COLL
    dmin = 0 if coll in ("latency", "bw") else 1
    try:
        if ns.message_size is None:
            mn, mx = dmin, dmax
        else:
            mn, mx = parse_message_range(ns.message_size, dmin, dmax)
        dt = normalize_dtype(ns.dtype)
        root_mode, root = parse_root(ns.root_rank)
    except ValueError as e:
        parser.error(str(e))
    dtypes = list(DTYPE_ALL) if dt == "all" else [dt]
    op = ns.op.strip().lower()
    if op != "all" and op not in OPS:
        parser.error(f"unknown op {ns.op!r}; choose from {', '.join(OPS)} or all")
    ops = list(OPS) if op == "all" else [op]
    for name in ("iterations", "warmup"):
        v = getattr(ns, name)
        if v is not None and v < (1 if name == "iterations" else 0):
            parser.error(f"--{name} must be {'>= 1' if name == 'iterations' else '>= 0'}")
    if ns.nprocs < 1:
        parser.error("-n must be >= 1")
    if ns.window < 1:
        parser.error("-W must be >= 1")
    if ns.time_budget is not None and ns.time_budget <= 0:
        parser.error("--time-budget must be > 0")
    if coll in PT2PT and coll not in ("latency", "bw") and ns.device != "cpu":
        parser.error(f"{coll}: the one-sided tests measure host windows "
                     "(device windows: docs/windows.md#device-memory); use -d cpu")
    modes = _modes(parser, ns, coll)
    if ns.compress:
        if coll not in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
            parser.error(f"--compress: for allreduce, reduce_scatter, allgather and broadcast, "
                         f"not {coll}")
        if ns.validation or modes.check_every:
            parser.error("--compress and -c/--check-every: validation expects exact results; "
                         "--compress reports the measured error against its bound instead")
        if any(d not in ("float32", "float64", "float16", "bfloat16") for d in dtypes):
            parser.error("--compress: float dtypes only (-T float32, float64, float16, "
                         "bfloat16)")
    corrupt = ns.corrupt_rank
    if corrupt is None:
        try:
            corrupt = corrupt_rank_from_env()
        except ValueError as e:      # pycoll.InvalidArgument, naming the variable
            parser.error(str(e))
    return Options(
        collective=coll, min_size=mn, max_size=mx, iterations=ns.iterations, warmup=ns.warmup,
        full=ns.full, dtypes=dtypes, ops=ops, validate=ns.validation or modes.check_every > 0,
        root_mode=root_mode,
        root=root, nprocs=ns.nprocs, algo=ns.algo, transport=ns.transport, device=ns.device,
        json=ns.json, csv=ns.csv, plot=ns.plot, fmt=ns.fmt, timing=ns.timing,
        window=ns.window, time_budget=ns.time_budget, min_iterations=max(1, ns.min_iterations),
        quiet=ns.quiet, corrupt_rank=corrupt, label=ns.label, modes=modes,
        compress=ns.compress, window_type=ns.window_type,
    )


def _modes(parser: argparse.ArgumentParser, ns: argparse.Namespace, coll: str) -> Modes:
    """The optional measurements, refused (status 2, before any rank starts) where they
    have no meaning."""
    if ns.check_every < 0:
        parser.error("--check-every must be >= 1 (or 0: off)")
    if ns.nonblocking < 0:
        parser.error("--nonblocking must be >= 1 (or 0: blocking calls)")
    per_iteration = [flag for flag, on in (("-P", ns.percentiles),
                                           ("--check-every", ns.check_every),
                                           ("--nonblocking", ns.nonblocking)) if on]
    if per_iteration and coll in PT2PT:
        parser.error(f"{' and '.join(per_iteration)}: for collectives, not the point-to-point "
                     f"{coll} test")
    if per_iteration and ns.timing != "osu":
        parser.error(f"{' and '.join(per_iteration)} time each iteration: they need "
                     "--timing osu (the default)")
    if ns.check_every and ns.nonblocking:
        parser.error("--check-every and --nonblocking: choose one (the checks run on "
                     "blocking calls)")
    return Modes(percentiles=ns.percentiles, check_every=ns.check_every, memory=ns.memory,
                 nonblocking=ns.nonblocking)
