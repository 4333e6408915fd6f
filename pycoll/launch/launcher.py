"""Single-host launcher: ``python -m pycoll.run -n N script.py [args...]``.

The launcher process runs the job's rendezvous store (``rendezvous.StoreServer``, with a fresh
job token), spawns N ranks of ``sys.executable <command>``, each in its own session/process
group, and watches them:

* all ranks exit 0 -> exit code 0;
* a rank exits non-zero or is killed by a signal -> every other rank's process group gets
  SIGTERM, then SIGKILL after a grace period; the launcher prints which rank failed first and
  exits with that rank's code (128 + signal number if it was killed by a signal);
* SIGINT / SIGTERM to the launcher -> forwarded to every rank, then the same tear-down; exit
  code 128 + signal number. A second signal skips the grace period;
* ``timeout`` seconds elapse -> tear-down, exit code 124.

Ranks also die with the launcher if it is killed with SIGKILL (``PR_SET_PDEATHSIG`` on Linux).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

if TYPE_CHECKING:  # imported lazily at run time, so that `import pycoll.launch` stays cheap
    from rendezvous import StoreServer

__all__ = ["launch", "main", "EXIT_TIMEOUT", "GRACE_PERIOD"]

#: Exit code when ``timeout`` expires (as coreutils' ``timeout``).
EXIT_TIMEOUT = 124
#: Seconds between SIGTERM and SIGKILL during tear-down.
GRACE_PERIOD = 5.0
_POLL_INTERVAL = 0.02

_PREFIX = "pycoll.run"


# --------------------------------------------------------------------------------------------
# child process setup


def _make_preexec():
    """A preexec_fn that asks Linux to SIGKILL the child when the launcher (the forking
    thread) dies. Everything is resolved before fork; the child only makes two calls."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG = 1
    sigkill = int(signal.SIGKILL)
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        # the launcher may have died between fork and prctl: then nobody would kill us
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _connect_host(bind_host: str) -> str:
    """The address ranks use to reach a server bound to ``bind_host``."""
    if bind_host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bind_host == "::":
        return "::1"
    return bind_host


def _free_port(host: str) -> int:
    """A port that is free on ``host`` right now (for torch's TCPStore, not ours)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
    except socket.gaierror:
        family, addr = socket.AF_INET, ("127.0.0.1", 0)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(addr)
        return s.getsockname()[1]


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by signal {-code} ({_signal_name(-code)})"
    return f"exited with code {code}"


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _err(msg: str) -> None:
    try:
        sys.stderr.write(f"{_PREFIX}: {msg}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------------------------
# output prefixing


class _Output:
    """Writes whole lines to one of our streams under a lock (one per stream)."""

    def __init__(self, stream: IO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def write_line(self, data: bytes) -> None:
        with self.lock:
            try:
                buf = getattr(self.stream, "buffer", None)
                if buf is not None:
                    self.stream.flush()
                    buf.write(data)
                    buf.flush()
                else:
                    self.stream.write(data.decode("utf-8", "replace"))
                    self.stream.flush()
            except (OSError, ValueError):
                pass  # our stream is gone (closed pipe): drop the output, keep the job running


def _pump(pipe: IO[bytes], prefix: bytes, out: _Output) -> None:
    try:
        for line in iter(pipe.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            out.write_line(prefix + line)
    except (OSError, ValueError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


# --------------------------------------------------------------------------------------------
# the job


class _Job:
    def __init__(self, nprocs: int, grace: float) -> None:
        self.nprocs = nprocs
        self.grace = grace
        self.procs: List[subprocess.Popen] = []
        self.pumps: List[threading.Thread] = []
        self.signals: List[int] = []  # received by the launcher, in order
        # the job's store: pycoll's abort record names the first failure
        self.server: Optional[StoreServer] = None
        self.control: Any = None      # nodes.JobControl of a job on several hosts
        self.first_rank = 0           # global rank of this host's first rank

    # signal handler: only records; the main loop acts
    def on_signal(self, signum: int, frame) -> None:  # noqa: ARG002
        self.signals.append(signum)

    def running(self) -> List[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def _killpg(self, p: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            # group gone; the leader itself may still be unreaped (zombie): fine
            pass

    def signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.returncode is None:
                self._killpg(p, sig)

    def teardown(self, first_signal: int = signal.SIGTERM) -> None:
        """Signal every live rank's group, wait up to the grace period, then SIGKILL."""
        self.signal_all(first_signal)
        n_signals = len(self.signals)
        deadline = time.monotonic() + self.grace
        while self.running() and time.monotonic() < deadline:
            if len(self.signals) > n_signals:  # impatient user: a second signal
                break
            time.sleep(_POLL_INTERVAL)
        self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL every rank's process group (grandchildren included) and reap every rank."""
        for p in self.procs:
            self._killpg(p, signal.SIGKILL)
        for p in self.procs:
            try:
                p.wait()
            except Exception:  # pragma: no cover - wait() on a SIGKILLed child cannot hang
                pass
        for t in self.pumps:
            t.join(timeout=2.0)


def launch(
    command: Sequence[str],
    nprocs: int,
    *,
    prefix_output: bool = False,
    timeout: Optional[float] = None,
    env: Optional[Mapping[str, str]] = None,
    master_addr: str = "127.0.0.1",
    master_port: int = 0,
    grace_period: float = GRACE_PERIOD,
    nnodes: int = 1,
    node_rank: int = 0,
    token: Optional[str] = None,
) -> int:
    """Run ``sys.executable *command`` as ``nprocs`` ranks on this host; return the exit code.

    ``command`` is the argv after the interpreter: ``["script.py", "arg"]`` or
    ``["-m", "pycoll.bench", "allreduce"]``. ``env`` is the base environment of the ranks
    (default: ``os.environ``); the launcher adds the PYCOLL_* and torchrun-style variables.
    The store listens on ``master_addr:master_port`` (port 0: any free port).

    Returns 0 when every rank exits 0; otherwise the first failing rank's exit code
    (128 + signal number if it was killed), 124 on timeout, 128 + signal number when the
    launcher itself received SIGINT/SIGTERM.

    Several hosts (``nnodes`` > 1): one launcher per host, each with its ``node_rank``, the
    same ``nprocs``, ``master_addr:master_port`` (node 0's store, which node 0's launcher
    hosts) and ``token`` (the job secret, from each launcher's environment; see ``nodes.py``).
    Ranks are numbered across hosts; a failing rank on any host ends the job on every host.
    """
    command = list(command)
    if not command:
        raise ValueError("launch: command is empty (expected e.g. ['script.py'] or ['-m', 'module'])")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"launch: nprocs must be a positive integer, got {nprocs!r}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"launch: timeout must be positive, got {timeout!r}")

    if not 0 <= node_rank < nnodes:
        raise ValueError(f"launch: node_rank {node_rank} is not in [0, {nnodes})")
    if nnodes > 1 and (not token or not master_port):
        raise ValueError(
            "launch: a job on several hosts needs the same secret and store port on every "
            "node's launcher: export PYCOLL_TOKEN (e.g. $(python -c 'import secrets; "
            "print(secrets.token_hex(16))'), shared the way you share the job's files) and "
            "pass --master-port")

    import rendezvous  # imported here so that `import pycoll.launch` stays cheap

    token = token or secrets.token_hex(16)
    server = None
    if node_rank == 0:
        server = rendezvous.StoreServer(master_addr, master_port, token=token)
        server.start()
    job = _Job(nprocs, grace_period)
    job.server = server
    job.first_rank = node_rank * nprocs
    old_handlers: Dict[int, object] = {}
    try:
        host = _connect_host(master_addr)
        store_port = int(server.port) if server is not None else master_port
        torch_port = _free_port(host) if node_rank == 0 else None
        while torch_port == store_port:  # pragma: no cover - port 0 never returns a bound port
            torch_port = _free_port(host)
        if nnodes > 1:
            from .nodes import JobControl
            job.control = JobControl(host, store_port, token, node_rank, nnodes)
            torch_port = job.control.torch_port(torch_port)
        world = nnodes * nprocs

        base = dict(os.environ if env is None else env)
        if prefix_output:
            base.setdefault("PYTHONUNBUFFERED", "1")  # so prefixed lines arrive as they are printed

        # Install handlers before spawning, so a signal during startup is not lost.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                try:
                    old_handlers[sig] = signal.signal(sig, job.on_signal)
                except (ValueError, OSError):  # pragma: no cover
                    pass

        preexec = _make_preexec()
        outs = (_Output(sys.stdout), _Output(sys.stderr)) if prefix_output else None
        for local in range(nprocs):
            if job.signals:
                break
            rank = node_rank * nprocs + local
            child_env = dict(base)
            child_env.update(
                {
                    "PYCOLL_RANK": str(rank),
                    "PYCOLL_WORLD_SIZE": str(world),
                    "PYCOLL_LOCAL_RANK": str(local),
                    "PYCOLL_LOCAL_WORLD_SIZE": str(nprocs),
                    "PYCOLL_MASTER_ADDR": host,
                    "PYCOLL_MASTER_PORT": str(store_port),
                    "PYCOLL_STORE_EXTERNAL": "1",
                    "PYCOLL_TOKEN": token,
                    # torchrun-compatible; MASTER_PORT is a *different* free port, for torch's
                    # own TCPStore (env:// init), since ours already holds PYCOLL_MASTER_PORT.
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": str(nprocs),
                    "GROUP_RANK": str(node_rank),
                    "MASTER_ADDR": host,
                    "MASTER_PORT": str(torch_port),
                }
            )
            pipe = subprocess.PIPE if prefix_output else None
            proc = subprocess.Popen(
                [sys.executable, *command],
                env=child_env,
                stdin=None if rank == 0 else subprocess.DEVNULL,
                stdout=pipe,
                stderr=pipe,
                start_new_session=True,
                preexec_fn=preexec,
                close_fds=True,
            )
            job.procs.append(proc)
            if outs is not None:
                for pipe_, out in ((proc.stdout, outs[0]), (proc.stderr, outs[1])):
                    t = threading.Thread(
                        target=_pump,
                        args=(pipe_, f"[rank {rank}] ".encode(), out),
                        name=f"pycoll.run-output-{rank}",
                        daemon=True,
                    )
                    t.start()
                    job.pumps.append(t)

        return _monitor(job, timeout)
    finally:
        # Every path (success, failure, exception, KeyboardInterrupt) reaps every rank,
        # then removes the shared-memory segments a rank killed mid-setup left behind.
        try:
            if any(p.returncode is None for p in job.procs):
                job.teardown()
            else:
                job.kill_all()
            from ..transports.shm.segment import sweep
            sweep(p.pid for p in job.procs)
            if job.control is not None:
                job.control.finish(wait=grace_period + 30.0, beat_timeout=grace_period + 3.0)
        finally:
            for signum, handler in old_handlers.items():
                try:
                    signal.signal(signum, handler)  # type: ignore[arg-type]
                except (ValueError, OSError, TypeError):  # pragma: no cover
                    pass
            if server is not None:
                try:
                    server.close()
                except Exception:  # pragma: no cover
                    pass


def _abort_record(job: _Job) -> Optional[str]:
    """The world communicator's abort record (the first rank whose collective failed)."""
    if job.server is None and job.control is not None:   # another host runs the store
        return job.control.abort_record()
    data = getattr(job.server, "_data", None)
    raw = data.get(b"pycoll/world/abort") if isinstance(data, dict) else None
    if raw is None:
        return None
    try:
        from ..runtime.abort import _parse, describe_record

        return describe_record(_parse(raw))
    except Exception:  # noqa: BLE001 - a report must never break the launcher
        return None


def _monitor(job: _Job, timeout: Optional[float]) -> int:
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    while True:
        if job.signals:
            sig = job.signals[0]
            live = len(job.running())
            _err(
                f"received {_signal_name(sig)}; forwarding it to {live} running rank(s) "
                "and shutting down"
            )
            job.teardown(first_signal=sig)
            return 128 + int(sig)

        failed = None
        done = 0
        for rank, p in enumerate(job.procs):
            rc = p.poll()
            if rc is None:
                continue
            if rc != 0 and failed is None:
                failed = rank
            done += 1
        if failed is not None:
            rc = job.procs[failed].returncode
            live = len(job.running())
            where = f" on {socket.gethostname()}" if job.control is not None else ""
            _err(
                f"rank {job.first_rank + failed}{where} (pid {job.procs[failed].pid}) "
                f"{_describe_exit(rc)}; terminating the other {live} running rank(s)"
            )
            if job.control is not None:
                job.control.report_failure(job.first_rank + failed, _describe_exit(rc),
                                           _exit_code(rc) or 1)
            first = _abort_record(job)
            if first:
                # Ranks aborted by another rank's failure may exit before it: name the cause.
                _err(f"first failure (pycoll abort record): {first}")
            job.teardown()
            return _exit_code(rc) or 1
        if done == len(job.procs) and len(job.procs) == job.nprocs:
            return 0
        remote = job.control.failure_elsewhere() if job.control is not None else None
        if remote is not None:
            _err(f"rank {remote.get('rank')} on host {remote.get('host')} "
                 f"{remote.get('exit')}; terminating the {len(job.running())} rank(s) of this "
                 "host")
            first = _abort_record(job)
            if first:
                _err(f"first failure (pycoll abort record): {first}")
            job.teardown()
            return int(remote.get("code") or 1)

        if deadline is not None and time.monotonic() >= deadline:
            live = len(job.running())
            _err(f"timed out after {timeout:g} s; terminating {live} running rank(s)")
            job.teardown()
            return EXIT_TIMEOUT
        time.sleep(_POLL_INTERVAL)


# --------------------------------------------------------------------------------------------
# command line

_USAGE = """\
usage: python -m pycoll.run -n N [options] script.py [args...]
       python -m pycoll.run -n N [options] -m module [args...]

Run N ranks of a Python program on this host, with a rendezvous store for them.

options:
  -n, --nproc N          number of ranks (aliases: --nprocs, --nproc-per-node)
  --prefix-output        prefix every output line with "[rank K] "
  --timeout S            kill the job after S seconds (exit code 124)
  --master-addr A        address the store binds to and ranks connect to (default 127.0.0.1)
  --master-port P        port of the store (default 0: any free port)
  --nnodes K             hosts in the job: run one launcher per host (default 1)
  --node-rank I          this host's index in [0, K); node 0 hosts the store at
                         --master-addr:--master-port (both required with K > 1), and every
                         launcher needs the same PYCOLL_TOKEN in its environment, or
  --token-file F         a file holding the job secret (never put it on a command line)
  -h, --help             show this help

Exit code: 0 if every rank exits 0; else the first failing rank's exit code (128+signal if it was
killed by a signal), 124 on timeout, 128+signal if the launcher was interrupted.
"""

_VALUE_OPTS = {"-n", "--nproc", "--nprocs", "--nproc-per-node", "--nproc_per_node", "--timeout",
               "--master-addr", "--master_addr", "--master-port", "--master_port", "--nnodes",
               "--node-rank", "--node_rank", "--token-file", "--token_file"}
_FLAG_OPTS = {"--prefix-output", "--prefix_output", "-h", "--help"}


class _UsageError(Exception):
    pass


def _parse_args(argv: Sequence[str]):
    """Split argv into launcher options and the rank command (argv after the interpreter).

    Parsing stops at the script (first non-option word), at ``-m module`` or after ``--``, so
    the program's own options are never taken for the launcher's.
    """
    opts: Dict[str, str] = {}
    flags = set()
    command: List[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            command = args[i + 1:]
            break
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            module = a[2:] or (args[i + 1] if i + 1 < len(args) else "")
            if not module:
                raise _UsageError("-m needs a module name")
            rest = args[i + 1:] if a[2:] else args[i + 2:]
            command = ["-m", module, *rest]
            break
        if not a.startswith("-") or a == "-":
            command = args[i:]
            break
        name, eq, value = a.partition("=")
        if name.startswith("-n") and not name.startswith("--") and len(name) > 2 and not eq:
            name, eq, value = "-n", "=", name[2:]  # -n4
        if name in _FLAG_OPTS and not eq:
            flags.add(name)
            i += 1
            continue
        if name in _VALUE_OPTS:
            if not eq:
                if i + 1 >= len(args):
                    raise _UsageError(f"{name} needs a value")
                value = args[i + 1]
                i += 1
            opts[name.replace("_", "-")] = value
            i += 1
            continue
        raise _UsageError(f"unknown option {a!r}")

    if flags & {"-h", "--help"}:
        return None

    nproc = None
    for key in ("-n", "--nproc", "--nprocs", "--nproc-per-node"):
        if key in opts:
            nproc = opts[key]
    if nproc is None:
        raise _UsageError("-n N is required")
    try:
        n = int(nproc)
    except ValueError:
        raise _UsageError(f"-n: not an integer: {nproc!r}") from None
    if n < 1:
        raise _UsageError(f"-n must be at least 1, got {n}")
    timeout = None
    if "--timeout" in opts:
        try:
            timeout = float(opts["--timeout"])
        except ValueError:
            raise _UsageError(f"--timeout: not a number: {opts['--timeout']!r}") from None
        if not timeout > 0:
            raise _UsageError("--timeout must be positive")
    port = 0
    if "--master-port" in opts:
        try:
            port = int(opts["--master-port"])
        except ValueError:
            raise _UsageError(f"--master-port: not an integer: {opts['--master-port']!r}") from None
        if not 0 <= port <= 65535:
            raise _UsageError("--master-port must be in [0, 65535]")
    if not command:
        raise _UsageError("no program given (script.py [args...] or -m module [args...])")
    nodes = {}
    for key, name in (("--nnodes", "nnodes"), ("--node-rank", "node_rank")):
        if key in opts:
            try:
                nodes[name] = int(opts[key])
            except ValueError:
                raise _UsageError(f"{key}: not an integer: {opts[key]!r}") from None
    nnodes, node_rank = nodes.get("nnodes", 1), nodes.get("node_rank", 0)
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise _UsageError(f"--node-rank must be in [0, --nnodes), got {node_rank} of {nnodes}")
    token = os.environ.get("PYCOLL_TOKEN") or None
    if "--token-file" in opts:
        try:
            with open(opts["--token-file"]) as f:
                token = f.read().strip() or None
        except OSError as e:
            raise _UsageError(f"--token-file: {e}") from None
    if nnodes > 1 and (token is None or port == 0 or "--master-addr" not in opts):
        raise _UsageError("a job on several hosts (--nnodes > 1) needs --master-addr (node 0's "
                          "address), --master-port, and the same secret on every host: "
                          "PYCOLL_TOKEN in each launcher's environment or --token-file")
    return {
        "command": command,
        "nprocs": n,
        "prefix_output": bool(flags & {"--prefix-output", "--prefix_output"}),
        "timeout": timeout,
        "master_addr": opts.get("--master-addr", "127.0.0.1"),
        "master_port": port,
        "nnodes": nnodes,
        "node_rank": node_rank,
        "token": token,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m pycoll.run``; returns the exit code."""
    if argv is None:
        argv = sys.argv[1:]
    try:
        parsed = _parse_args(argv)
    except _UsageError as e:
        sys.stderr.write(_USAGE)
        _err(f"error: {e}")
        return 2
    if parsed is None:
        sys.stdout.write(_USAGE)
        return 0
    try:
        return launch(**parsed)
    except KeyboardInterrupt:  # only possible before the launcher's handlers are installed
        return 128 + int(signal.SIGINT)
    except Exception as e:  # e.g. the store could not bind its port
        _err(f"error: {type(e).__name__}: {e}")
        return 1
