"""One host's ranks of a ``pycoll.run`` job: spawning, watching, signals, tear-down.

Each rank is ``sys.executable <command>`` in its own session and process group. The
supervisor watches them:

* all ranks exit 0 -> exit code 0;
* a rank exits non-zero or is killed by a signal -> every other rank's process group gets
  SIGTERM, then SIGKILL after a grace period; the launcher prints which rank failed first and
  exits with that rank's code (128 + signal number if it was killed by a signal);
* SIGINT / SIGTERM / SIGHUP to the launcher -> forwarded to every rank, then the same
  tear-down; exit code 128 + signal number. A second signal skips the grace period;
* ``timeout`` seconds elapse -> tear-down, exit code 124;
* a rank of another host fails (``nodes.JobControl``) -> tear-down, that rank's exit code;
* ``--elastic`` (``elastic.ElasticPolicy``): a failing rank is lost, not the job's end, while
  enough ranks run on; the policy judges every rank's end and says when the job is over.
  With ``--max-restarts`` it has the supervisor start replacements (``_start_replacement``),
  supervised like the ranks.

Ranks also die with the launcher if it is killed with SIGKILL (``PR_SET_PDEATHSIG`` on Linux).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from .elastic_policy import replacement_environment
from .outcomes import describe_exit, exit_code, notice, signal_name

if TYPE_CHECKING:
    from rendezvous import StoreServer

    from .elastic_policy import ElasticPolicy
    from .nodes import JobControl

__all__ = ["Supervisor", "notice", "EXIT_TIMEOUT", "GRACE_PERIOD"]

#: Exit code when ``timeout`` expires (as coreutils' ``timeout``).
EXIT_TIMEOUT = 124
#: Seconds between SIGTERM and SIGKILL during tear-down.
GRACE_PERIOD = 5.0
_POLL_INTERVAL = 0.02

#: the world communicator's abort record (``runtime.abort``): the first failing collective
_ABORT_KEY = "pycoll/world/abort"


# --------------------------------------------------------------------------------------------
# child process setup


def _make_preexec() -> Callable[[], None] | None:
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


# --------------------------------------------------------------------------------------------
# the ranks' output


#: A line longer than this is forwarded in pieces (each ended by a newline), so that a rank
#: writing without newlines cannot make the launcher hold its output in memory unbounded.
_MAX_LINE = 1 << 20


class _Output:
    """Writes whole lines to one of our streams under a lock (one per stream), so that two
    ranks' lines never mix within a line."""

    def __init__(self, stream: IO) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def write_lines(self, data: bytes) -> None:
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
    """Forwards one rank stream's whole lines, each with ``prefix``, until the rank closes
    it; a last line without a newline (the rank's partial line at exit) gets one. What one
    read brings goes out in one locked write, the partial line at its end waits for the
    rest: a rank's ``print`` may take several writes (``PYTHONUNBUFFERED``), and writing
    them as they come would put another rank's output inside the line. A carriage return
    ends a line too: a progress bar (tqdm's) redraws its line after ``\r`` and never ends it
    until it is done, so waiting for ``\n`` would show nothing of it until then."""
    pending = b""
    after_cr = False
    try:
        fd = pipe.fileno()
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            pending += chunk
            cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
            if not cut and len(pending) >= _MAX_LINE:
                cut = len(pending)
            if not cut:
                continue
            lines, pending = pending[:cut], pending[cut:]
            out.write_lines(_prefixed(lines, prefix, after_cr))
            after_cr = lines.endswith(b"\r")
    except (OSError, ValueError):
        pass
    finally:
        if pending:
            out.write_lines(_prefixed(pending, prefix, after_cr))
        try:
            pipe.close()
        except OSError:
            pass


#: a line and its end: ``\n``, ``\r\n`` or a lone ``\r`` (a redrawn line), or the last
#: line without one
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def _prefixed(data: bytes, prefix: bytes, after_cr: bool = False) -> bytes:
    """``data``'s lines, each with ``prefix`` and kept with its own end (a ``\r`` stays a
    ``\r``: the terminal redraws the line, prefix included); the last one, if it has no
    end, gets a newline. ``after_cr``: the previous data ended with ``\r``, so a ``\n`` first
    is the rest of a ``\r\n`` two reads split, and comes out alone, without a prefix."""
    out: list[bytes] = []
    for line in _LINE.findall(data):
        if line == b"\n" and after_cr and not out:
            out.append(line)
        else:
            out.append(prefix + line if line.endswith((b"\n", b"\r")) else prefix + line + b"\n")
    return b"".join(out)


# --------------------------------------------------------------------------------------------
# the supervisor


class Supervisor:
    """This host's ranks: ``start`` spawns them, ``watch`` waits for the job's end, ``close``
    reaps them whatever happened (call it in a ``finally``).

    ``server`` is the job's store when this host runs it, ``control`` the link to the other
    hosts' launchers (several hosts); either names the first failure (the abort record).
    ``elastic`` judges the ranks' ends under ``--elastic``; without it the first failure
    ends the job.
    """

    def __init__(self, nprocs: int, grace: float, *, first_rank: int = 0,
                 server: StoreServer | None = None,
                 elastic: ElasticPolicy | None = None) -> None:
        self.nprocs = nprocs
        self.grace = grace
        self.first_rank = first_rank         # global rank of this host's first rank
        self.server = server
        self.elastic = elastic
        self.control: JobControl | None = None
        self._result_posted = False          # elastic, several hosts: this host's is posted
        self._next_host_look = 0.0
        self.procs: list[subprocess.Popen] = []
        self.envs: list[Mapping[str, str]] = []   # each process's environment
        self.command: list[str] = []
        self._preexec: Callable[[], None] | None = None
        self._outs = (_Output(sys.stdout), _Output(sys.stderr))  # the ranks' lines go there
        self._prefix = False                 # "[rank K] " before each line
        self.pumps: list[threading.Thread] = []
        self.signals: list[int] = []  # received by the launcher, in order
        self._old_handlers: dict[int, Any] = {}

    # -- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:  # noqa: ARG002
        self.signals.append(signum)         # only records; ``watch`` acts

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return                          # only the main thread may; the job still runs
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):  # pragma: no cover
                pass

    def _restore_handlers(self) -> None:
        for signum, handler in self._old_handlers.items():
            try:
                signal.signal(signum, handler)
            except (ValueError, OSError, TypeError):  # pragma: no cover
                pass
        self._old_handlers.clear()

    # -- the ranks -------------------------------------------------------------------------
    def start(self, command: Sequence[str], envs: Sequence[Mapping[str, str]],
              prefix_output: bool) -> None:
        """Spawn ``sys.executable *command`` once per environment (local rank order). The
        signal handlers go in first, so that a signal during startup is not lost."""
        self._install_handlers()
        self.command = list(command)
        self._preexec = _make_preexec()
        self._outs = (_Output(sys.stdout), _Output(sys.stderr))
        self._prefix = prefix_output
        for local, env in enumerate(envs):
            if self.signals:
                break
            rank = self.first_rank + local
            self._spawn(env, f"rank {rank}", stdin=rank == 0)

    def _spawn(self, env: Mapping[str, str], label: str, *,
               stdin: bool = False) -> subprocess.Popen:
        """One process of the job. Its output goes through pipes that threads read
        (``_pump``), so that the ranks' lines reach our stdout and stderr whole, prefixed
        with ``[label] `` when asked."""
        proc = subprocess.Popen(
            [sys.executable, *self.command],
            env=dict(env),
            stdin=None if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=self._preexec,
            close_fds=True,
        )
        self.procs.append(proc)
        self.envs.append(env)
        prefix = f"[{label}] ".encode() if self._prefix else b""
        for stream, out in ((proc.stdout, self._outs[0]), (proc.stderr, self._outs[1])):
            assert stream is not None
            t = threading.Thread(target=_pump, args=(stream, prefix, out),
                                 name=f"pycoll.run-output-{label}", daemon=True)
            t.start()
            self.pumps.append(t)
        return proc

    def _start_replacement(self, index: int, label: str, rank: int) -> subprocess.Popen:
        """A replacement for process ``index`` (``--max-restarts``): its command and
        environment, joining the running job (``elastic.replacement_environment``)."""
        return self._spawn(replacement_environment(self.envs[index], rank), label)

    def running(self) -> list[subprocess.Popen]:
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

    def close(self) -> None:
        """Reap every rank (tearing down live ones), remove what a rank killed mid-setup left
        behind (each transport's ``sweep_leftovers``: shm's segments), tell the other hosts
        this one is done, and give back the signal handlers. Every path (success, failure,
        exception, KeyboardInterrupt) ends here."""
        try:
            if any(p.returncode is None for p in self.procs):
                self.teardown()
            else:
                self.kill_all()
            from ..transports import registry
            registry.sweep_leftovers(p.pid for p in self.procs)
            if self.control is not None:
                self.control.finish(wait=self.grace + 30.0, beat_timeout=self.grace + 3.0)
        finally:
            self._restore_handlers()

    # -- watching --------------------------------------------------------------------------
    def _abort_record(self) -> str | None:
        """The world communicator's abort record (the first rank whose collective failed)."""
        if self.server is None:
            # another host runs the store
            return self.control.abort_record() if self.control is not None else None
        raw = self.server.peek(_ABORT_KEY)
        if raw is None:
            return None
        try:
            from ..runtime.abort import _parse, describe_record

            return describe_record(_parse(raw))
        except Exception:  # noqa: BLE001 - a report must never break the launcher
            return None

    def _report_first_failure(self) -> None:
        first = self._abort_record()
        if first:
            # Ranks aborted by another rank's failure may exit before it: name the cause.
            notice(f"first failure (pycoll abort record): {first}")

    def _local_failure(self) -> int | None:
        """The exit code for a rank of this host that failed (the lowest), or None."""
        failed = next((i for i, p in enumerate(self.procs)
                       if p.poll() is not None and p.returncode != 0), None)
        if failed is None:
            return None
        rc = self.procs[failed].returncode
        live = len(self.running())
        where = f" on {socket.gethostname()}" if self.control is not None else ""
        notice(f"rank {self.first_rank + failed}{where} (pid {self.procs[failed].pid}) "
               f"{describe_exit(rc)}; terminating the other {live} running rank(s)")
        if self.control is not None:
            self.control.report_failure(self.first_rank + failed, describe_exit(rc),
                                        exit_code(rc) or 1)
        self._report_first_failure()
        self.teardown()
        return exit_code(rc) or 1

    def _elastic_end(self) -> int | None:
        """The exit code once the elastic policy says the job is over, else None. It tears
        down what still runs then: the ranks when fewer than ``--min-ranks`` are left,
        replacements nobody is left to admit. On several hosts it also keeps the other
        launchers informed (``nodes.JobControl``), and node 0 judges lost hosts and outlives
        the others."""
        assert self.elastic is not None
        control = self.control
        if control is not None:
            if control.unreachable:
                return self._store_lost(control)
            control.publish(self.elastic.names(self.procs))
            if self.server is not None:
                for node, lost in control.newly_lost().items():
                    code = self.elastic.lose_host(f"{lost['host']} (node {node})",
                                                  lost["names"], self.procs,
                                                  self._start_for_lost_host)
                    if code is not None:
                        return self._end_elastic_job(code)
        code = self.elastic.judge(self.procs, self._start_replacement, self._lobby())
        if control is not None and control.unreachable:
            return self._store_lost(control)    # found while judging: nothing judged holds
        if code is None:
            return self._outlive_hosts() if self._result_posted else None
        if self.elastic.over is not None:
            return self._end_elastic_job(code)
        if self.running():                  # withdrawn replacements
            self.teardown()
        if control is None:
            return code
        control.post_result(self.elastic.result)
        self._result_posted = True
        return self._outlive_hosts()

    def _end_elastic_job(self, code: int) -> int:
        """Fewer than ``--min-ranks`` ranks are left: the other hosts' launchers are told,
        and this host's ranks torn down."""
        assert self.elastic is not None
        if self.control is not None:
            self.control.report_failure(self.elastic.over or "?", "ended the elastic job "
                                        f"(fewer than {self.elastic.min_ranks} ranks left)",
                                        code or 1)
        if code:
            self._report_first_failure()
        self.teardown()
        return code

    def _outlive_hosts(self) -> int | None:
        """This host's processes are done. Node 0 holds the store: it stays until every
        other host's launcher finished or was lost, judging lost hosts meanwhile, then
        answers for the whole job (``elastic.combine``); the others are done."""
        from .elastic_policy import combine

        assert self.elastic is not None and self.control is not None
        if self.server is None:
            return self.elastic.result["code"]
        now = time.monotonic()
        if self.running() or now < self._next_host_look:
            return None
        self._next_host_look = now + 0.2
        if self.control.others_running():
            return None
        code = combine([self.elastic.result, *self.control.results()])
        lost = self.control.lost_nodes()
        if lost or code:
            hosts = "".join(f", host {v['host']} (node {n}) lost" for n, v in lost.items())
            notice(f"elastic job done on {self.control.nnodes} hosts{hosts}; exit code {code}")
        return code

    def _store_lost(self, control: JobControl) -> int:
        """Node 0's store cannot be reached: the job cannot go on without it."""
        notice(f"the job's store at {control.address} (node 0's launcher) cannot be reached: "
               "node 0's host was lost, or this host was cut off from it, and an elastic job "
               f"cannot outlive its store; terminating the {len(self.running())} running "
               "rank(s) of this host")
        self.teardown()
        return 1

    def _lobby(self) -> Callable[[], int] | None:
        """What counts the processes waiting to join (node 0 reads its own server)."""
        if self.server is not None:
            return self._waiting_joiners
        return self.control.waiting_joiners if self.control is not None else None

    def _waiting_joiners(self) -> int:
        """Processes waiting to join the job now (in the lobby of this host's store)."""
        from .joiners import waiting_joiners

        assert self.server is not None
        return waiting_joiners(self.server)

    def _start_for_lost_host(self, label: str, rank: int) -> subprocess.Popen:
        """A replacement, on this host, for ``rank`` of a host that was lost: this host's
        environment with that rank's variables, joining the job. Its local rank is the
        next on this host (the processes started here so far, counting it)."""
        local = len(self.procs)
        env = {**self.envs[0], "PYCOLL_RANK": str(rank), "RANK": str(rank),
               "PYCOLL_LOCAL_RANK": str(local), "LOCAL_RANK": str(local),
               "PYCOLL_LOCAL_WORLD_SIZE": str(local + 1), "LOCAL_WORLD_SIZE": str(local + 1)}
        return self._spawn(replacement_environment(env, rank), label)

    def _remote_failure(self) -> int | None:
        """The exit code for a rank another host's launcher reported failed, or None."""
        remote = self.control.failure_elsewhere() if self.control is not None else None
        if remote is None:
            return None
        notice(f"rank {remote.get('rank')} on host {remote.get('host')} {remote.get('exit')}; "
               f"terminating the {len(self.running())} rank(s) of this host")
        self._report_first_failure()
        self.teardown()
        return int(remote.get("code") or 1)

    def watch(self, timeout: float | None) -> int:
        """Poll until the job ends; its exit code (the module docstring lists them)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.signals:
                sig = self.signals[0]
                notice(f"received {signal_name(sig)}; forwarding it to "
                       f"{len(self.running())} running rank(s) and shutting down")
                self.teardown(first_signal=sig)
                return 128 + int(sig)
            code = self._local_failure() if self.elastic is None else self._elastic_end()
            if code is not None:
                return code
            if self.elastic is None and len(self.procs) == self.nprocs and all(
                    p.returncode is not None for p in self.procs):
                return 0
            code = self._remote_failure()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                notice(f"timed out after {timeout:g} s; terminating {len(self.running())} "
                       "running rank(s)")
                self.teardown()
                return EXIT_TIMEOUT
            time.sleep(_POLL_INTERVAL)
