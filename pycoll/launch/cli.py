"""The command line of ``python -m pycoll.run``: its options, parsed with argparse, and ``main``.

As torchrun's: the launcher's options come first, and the program with its own arguments is
one ``argparse.REMAINDER``, so ``pycoll.run -n 2 train.py -n 5`` gives ``train.py`` the
arguments ``-n 5``. Launcher options end at the script name, at ``-m module``, or at ``--``.
Every option that has a dash in its name also takes torchrun's underscore spelling
(``--nproc_per_node``), hidden from the help. See docs/launcher.md.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .launcher import launch
from .supervisor import notice

__all__ = ["main"]

_USAGE = """\
python -m pycoll.run -n N [options] script.py [args...]
       python -m pycoll.run -n N [options] -m module [args...]"""

_EPILOG = """\
Several hosts: one launcher per host with the same -n, --nnodes, --master-addr and
--master-port; node 0 hosts the store. Every launcher needs the same secret: PYCOLL_TOKEN in
its environment, or --token-file (never put it on a command line).

Exit code: 0 if every rank exits 0; else the first failing rank's exit code (128+signal if it
was killed by a signal), 124 on timeout, 128+signal if the launcher was interrupted, 2 for a
usage error, 1 if the launcher could not start.

--elastic: a rank that fails is lost and the job goes on while at least --min-ranks ranks
still run; the survivors must catch the error and shrink their communicator
(docs/elastic.md). Exit code 0 when every rank that was not lost exits 0; fewer than M ranks
left: the others are torn down, exit code the failing rank's. --max-restarts K: up to K lost
ranks are replaced by a new process (PYCOLL_JOIN=1) that joins the job when the survivors
call grow(); it counts as running for --min-ranks. On several hosts M and K are the whole
job's, a host whose launcher is lost loses its ranks (node 0 starts their replacements), a
lost node 0 (the store) ends the job, and node 0's exit code is the job's."""


class _UsageError(Exception):
    """A command line the launcher cannot run; ``main`` prints it with the usage (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _at_least_zero(text: str) -> int:
    n = _integer(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


def _count(text: str) -> int:
    n = _integer(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError("must be positive")
    return seconds


def _port(text: str) -> int:
    port = _integer(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError("must be in [0, 65535]")
    return port


def _option(parser: argparse.ArgumentParser, *names: str, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(*names)``, plus torchrun's underscore spellings of the dashed
    long names (``--node_rank``), which the help does not list."""
    action = parser.add_argument(*names, **kwargs)
    underscored = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--")
                   and "-" in n[2:]]
    if underscored:
        parser.add_argument(*underscored, **{**kwargs, "dest": action.dest,
                                             "default": argparse.SUPPRESS,
                                             "help": argparse.SUPPRESS})
    return action


def _parser() -> _Parser:
    p = _Parser(prog="python -m pycoll.run", usage=_USAGE, add_help=False, allow_abbrev=False,
                description="Run N ranks of a Python program on this host, with a rendezvous "
                            "store for them.",
                epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _option(p, "-n", "--nproc", "--nprocs", "--nproc-per-node", dest="nprocs", type=_count,
            metavar="N", help="number of ranks (required)")
    _option(p, "--prefix-output", "--tag-output", action="store_true",
            help='prefix every output line with "[rank K] " (mpirun\'s --tag-output)')
    _option(p, "--timeout", type=_seconds, metavar="S",
            help="kill the job after S seconds (exit code 124)")
    _option(p, "--master-addr", metavar="A",
            help="address the store binds to and ranks connect to (default 127.0.0.1)")
    _option(p, "--master-port", type=_port, default=0, metavar="P",
            help="port of the store (default 0: any free port)")
    _option(p, "--nnodes", type=_integer, default=1, metavar="K",
            help="hosts in the job, one launcher per host (default 1)")
    _option(p, "--node-rank", type=_integer, default=0, metavar="I",
            help="this host's index in [0, K); node 0 hosts the store at "
                 "--master-addr:--master-port (both required with K > 1)")
    _option(p, "--token-file", metavar="F",
            help="a file holding the job secret (default: PYCOLL_TOKEN)")
    _option(p, "--elastic", action="store_true",
            help="a rank that fails does not end the job while at least M ranks still run "
                 "(ranks get PYCOLL_ELASTIC=1)")
    _option(p, "--min-ranks", type=_count, metavar="M",
            help="with --elastic: the fewest running ranks the job goes on with, every "
                 "host's, 1..N x --nnodes (default 1)")
    _option(p, "--max-restarts", type=_at_least_zero, metavar="K",
            help="with --elastic: start a replacement for each lost rank, K in all "
                 "(default 0); it joins when the survivors call grow()")
    p.add_argument("-m", dest="module", action="store_true",
                   help="run the program as a module (python -m module)")
    p.add_argument("-h", "--help", action="store_true", help="show this help")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="script.py [args...]",
                   help="the program and its own arguments")
    return p


def _split_attached_module(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` with python's attached ``-mmodule`` written ``-m module`` where it stands among
    the launcher's options (what comes before it parses to no program). argparse would read
    ``-mpkg`` as the flags ``-m -p -k -g``; a ``-mfoo`` among the program's own arguments
    stays as it is."""
    for i, word in enumerate(argv):
        if word.startswith("-m") and not word.startswith("--") and len(word) > 2:
            try:
                before = parser.parse_args(argv[:i])
            except _UsageError:
                return argv                         # reported when the whole line is parsed
            if before.program or before.module:
                return argv
            return [*argv[:i], "-m", word[2:], *argv[i + 1:]]
    return argv


def _read_token_file(path: str) -> str:
    """The job secret in ``path``: one line of printable ASCII, in a file only its owner can
    read (as ssh demands of a private key: a secret others can read keeps nobody out). Any
    other file is a usage error naming what is wrong, never a secret silently dropped or
    replaced by a fresh one."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read(4097)
    except OSError as e:
        raise _UsageError(f"--token-file: {e}") from None
    if mode & 0o077:
        raise _UsageError(f"--token-file {path}: the secret is readable or writable by other "
                          f"users (mode {mode & 0o777:04o}); run chmod 600 {path}")
    text = raw.strip()
    if not text:
        raise _UsageError(f"--token-file {path} is empty: write the job secret into it, e.g. "
                          "python -c 'import secrets; print(secrets.token_hex(16))' > FILE")
    if len(text) > 4096 or not all(33 <= b < 127 for b in text):
        raise _UsageError(f"--token-file {path} does not hold a secret: it must be one line of "
                          "printable ASCII without spaces, at most 4096 characters (e.g. "
                          "python -c 'import secrets; print(secrets.token_hex(16))')")
    return text.decode("ascii")


def _elastic_min_ranks(elastic: bool, min_ranks: int | None, nprocs: int, nnodes: int) -> int:
    """``--min-ranks`` (default 1), checked against ``-n`` and the job's hosts."""
    if not elastic:
        if min_ranks is not None:
            raise _UsageError("--min-ranks applies to elastic jobs only: add --elastic")
        return 1
    if min_ranks is None:
        return 1
    if min_ranks > nprocs * nnodes:
        raise _UsageError(f"--min-ranks must be in [1, {nprocs * nnodes}] (-n x --nnodes), "
                          f"got {min_ranks}")
    return min_ranks


def _parse_args(argv: Sequence[str]) -> dict[str, Any] | None:
    """``launch``'s keyword arguments from the command line; None for ``--help``."""
    parser = _parser()
    args = parser.parse_args(_split_attached_module(list(argv), parser))
    if args.help:
        return None
    if args.nprocs is None:
        raise _UsageError("-n N is required")
    program = args.program
    if program[:1] == ["--"]:                       # argparse keeps it in a REMAINDER
        program = program[1:]
    if args.module:
        if not program:
            raise _UsageError("-m needs a module name")
        program = ["-m", *program]
    if not program:
        raise _UsageError("no program given (script.py [args...] or -m module [args...])")
    nnodes, node_rank = args.nnodes, args.node_rank
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise _UsageError(f"--node-rank must be in [0, --nnodes), got {node_rank} of {nnodes}")
    min_ranks = _elastic_min_ranks(args.elastic, args.min_ranks, args.nprocs, nnodes)
    if args.max_restarts is not None and not args.elastic:
        raise _UsageError("--max-restarts applies to elastic jobs only: add --elastic")
    token = os.environ.get("PYCOLL_TOKEN") or None
    if args.token_file is not None:
        token = _read_token_file(args.token_file)
    if nnodes > 1 and (token is None or args.master_port == 0 or args.master_addr is None):
        raise _UsageError("a job on several hosts (--nnodes > 1) needs --master-addr (node 0's "
                          "address), --master-port, and the same secret on every host: "
                          "PYCOLL_TOKEN in each launcher's environment or --token-file")
    return {
        "command": program,
        "nprocs": args.nprocs,
        "prefix_output": args.prefix_output,
        "timeout": args.timeout,
        "master_addr": args.master_addr or "127.0.0.1",
        "master_port": args.master_port,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "token": token,
        "elastic": args.elastic,
        "min_ranks": min_ranks,
        "max_restarts": args.max_restarts or 0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pycoll.run``; returns the exit code."""
    try:
        parsed = _parse_args(sys.argv[1:] if argv is None else argv)
    except _UsageError as e:
        sys.stderr.write(_parser().format_usage())
        notice(f"error: {e}")
        return 2
    if parsed is None:
        sys.stdout.write(_parser().format_help())
        return 0
    try:
        return launch(**parsed)
    except KeyboardInterrupt:  # only possible before the launcher's handlers are installed
        return 128 + int(signal.SIGINT)
    except Exception as e:  # e.g. the store could not bind its port
        notice(f"error: {type(e).__name__}: {e}")
        return 1
