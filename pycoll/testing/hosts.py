"""Test hosts made of Linux network namespaces: several "machines" on one real one.

``NamespaceHosts(k)`` creates, and always removes again:

* a *switch* namespace holding a bridge, so nothing is added to the machine's own network;
* ``k`` host namespaces, each with loopback, one ``eth0`` (a veth pair whose other end is
  plugged into the bridge) and an address in a private range that exists only inside these
  namespaces (``10.<a>.<b>.<i+1>/24`` and ``fd<a>:<b>::<i+1>/64``, drawn per instance);
* per host: its own hostname (``run`` starts commands in a new UTS namespace) and its own
  ``/etc/hosts`` view (``/etc/netns/<name>/hosts``, which ``ip netns exec`` mounts), naming
  every host, so ranks resolve each other's names;
* optionally a shaped link per host (``tc`` on its ``eth0``: a ``tbf`` rate; ``netem`` delay
  where the kernel has it).

Only these namespaces and their loopbacks are ever addressed. Names carry the creating
process id (``pycoll-<pid>-h<i>``): ``sweep()`` removes namespaces (and ``/etc/netns``
entries) whose creator is dead, so a test killed halfway leaves nothing for long; the
context manager removes its own on exit, after a failure too.

Needs root, ``ip`` (iproute2) and ``unshare``; ``available()`` says whether this machine can.
Shared memory between namespace hosts is still the same /dev/shm, but pycoll tells hosts
apart by hostname, so ranks on different namespace hosts talk tcp, as on real machines.

Command line, for trying things by hand::

    python -m pycoll.testing.hosts 2 --rate 5gbit --delay 1ms -- \
        python -c "import socket; print(socket.gethostname())"
"""
from __future__ import annotations

import ipaddress
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..transports.shm.cma import process_exited

NETNS_ETC = "/etc/netns"


def available() -> tuple[bool, str]:
    """(True, "") if namespace hosts can be made here, else (False, why)."""
    if sys.platform != "linux":
        return False, "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return False, f"{tool} is not installed"
    return True, ""


def host_marks(timeout: float) -> list[Any]:
    """pytest marks of a test module that makes namespace hosts: its per-test ``timeout``,
    and a skip naming why hosts cannot be made here."""
    import pytest

    ok, why = available()
    return [pytest.mark.timeout(timeout),
            pytest.mark.skipif(not ok, reason=f"namespace hosts unavailable: {why}")]


def chosen_cases(ap: Any, text: str, allowed: Iterable[str], what: str) -> list[str]:
    """For a benchmark's command line: the comma-separated ``text``, each one of ``allowed``
    (else ``ap.error``); exits with 2, saying why, where namespace hosts cannot be made."""
    ok, why = available()
    if not ok:
        print(f"namespace hosts unavailable: {why}", file=sys.stderr)
        raise SystemExit(2)
    allowed = list(allowed)
    cases = [c.strip() for c in text.split(",") if c.strip()]
    for c in cases:
        if c not in allowed:
            ap.error(f"unknown {what} {c!r}; one of {', '.join(allowed)}")
    return cases


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def sweep() -> list[str]:
    """Delete namespaces (and their /etc/netns entries) left by dead creators."""
    removed = []
    names = _ip("netns", "list", check=False).stdout.split("\n")
    for line in names:
        name = line.split(" ")[0].strip()
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == "pycoll" and parts[1].isdigit():
            if process_exited(int(parts[1])):
                _ip("netns", "del", name, check=False)
                shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
                removed.append(name)
    return removed


def _burst(rate: str) -> str:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if rate.endswith(unit):
            bits = float(rate[:-len(unit)]) * scale
            return f"{max(64 * 1024, int(bits / 8 * 0.002))}b"
    return "1mb"


class NamespaceHosts:
    """``k`` namespace hosts on one bridge (see the module docstring)."""

    def __init__(self, k: int, *, rate: str | None = None, delay: str | None = None) -> None:
        if k < 1:
            raise ValueError("need at least one host")
        self.k = k
        self.rate = rate
        self.delay = delay
        pid = os.getpid()
        self._tag = f"{pid}-{random.randrange(1 << 16):04x}"
        self.names = [f"pycoll-{self._tag}-h{i}" for i in range(k)]
        self.hostnames = [f"pchost{i}" for i in range(k)]
        self.switch = f"pycoll-{self._tag}-sw"
        net = random.randrange(64, 128), random.randrange(0, 256)
        self.addresses = [f"10.{net[0]}.{net[1]}.{i + 1}" for i in range(k)]
        #: IPv6 addresses (unique local, fd00::/8), also only inside these namespaces
        self.addresses6 = [str(ipaddress.IPv6Address(f"fd{net[0]:02x}:{net[1]:02x}::{i + 1:x}"))
                           for i in range(k)]
        self._created: list[str] = []

    # -- life cycle --------------------------------------------------------------------------
    def __enter__(self) -> NamespaceHosts:
        sweep()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        _ip("netns", "add", self.switch)
        self._created.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{a} {h}\n" for a, h in zip(self.addresses, self.hostnames))
        for i, name in enumerate(self.names):
            _ip("netns", "add", name)
            self._created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
            # veth created inside the host namespace; its peer moves into the switch
            _ip("-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}",
                "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            _ip("-n", self.switch, "link", "set", f"p{i}", "up")
            _ip("-n", name, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            # nodad: usable at once, not after duplicate address detection's ~1 s
            _ip("-n", name, "addr", "add", f"{self.addresses6[i]}/64", "dev", "eth0", "nodad")
            _ip("-n", name, "link", "set", "eth0", "up")
            if self.rate or self.delay:
                self.shape(i, rate=self.rate, delay=self.delay)
            etc = os.path.join(NETNS_ETC, name)
            os.makedirs(etc, exist_ok=True)
            with open(os.path.join(etc, "hosts"), "w") as f:
                f.write(hosts_file)

    def close(self) -> None:
        """Remove every namespace this instance made (idempotent)."""
        for name in reversed(self._created):
            _ip("netns", "del", name, check=False)
            shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
        self._created.clear()

    # -- links -------------------------------------------------------------------------------
    def shape(self, i: int, *, rate: str | None = None, delay: str | None = None) -> None:
        """Shape host ``i``'s outgoing link: ``rate`` like "5gbit" (a token bucket, ``tbf``),
        ``delay`` like "1ms" (``netem``, which some kernels lack: then a clear error)."""
        if shutil.which("tc") is None:
            raise RuntimeError("tc is not installed: links cannot be shaped")
        if delay:
            args = ["tc", "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "netem",
                    "delay", delay]
            if rate:
                args += ["rate", rate]
        else:
            # burst: ~2 ms of traffic, so the bucket does not throttle below the rate
            args = ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", str(rate),
                    "burst", _burst(str(rate)), "latency", "100ms"]
        proc = subprocess.run(["ip", "netns", "exec", self.names[i], *args],
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            why = proc.stderr.strip()
            if delay and "unknown" in why:
                why += " (this kernel has no sch_netem: link delay cannot be emulated here)"
            raise RuntimeError(f"{' '.join(args)} in {self.names[i]}: {why}")

    def link(self, i: int, up: bool) -> None:
        """Take host ``i``'s link down or up (a cable pulled mid-job)."""
        _ip("-n", self.names[i], "link", "set", "eth0", "up" if up else "down")

    # -- running things on a host ------------------------------------------------------------
    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run on host ``i`` (its network, hostname and /etc/hosts)."""
        inner = f"hostname {shlex.quote(self.hostnames[i])} && exec " + shlex.join(argv)
        return ["ip", "netns", "exec", self.names[i], "unshare", "--uts", "sh", "-c", inner]

    def popen(self, i: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` on host ``i`` (own session, so a test can kill its whole tree)."""
        kwargs.setdefault("start_new_session", True)
        return subprocess.Popen(self.command(i, argv), env=dict(env or os.environ), **kwargs)

    def run(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        return subprocess.run(self.command(i, argv), **kwargs)

    # -- partitions --------------------------------------------------------------------------
    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Split the network: hosts in different ``groups`` can no longer reach each other,
        hosts in one group still can. Every group after the first gets a bridge of its own
        in the switch namespace and its hosts' ports move there (nothing but ``ip``: no
        firewall tool needed); hosts in no group stay with the first. Links stay up, as
        when a switch between racks fails. ``heal()`` joins everything again."""
        self.heal()
        seen: set[int] = set()
        for group in groups:
            for i in group:
                if not 0 <= i < self.k or i in seen:
                    raise ValueError(f"partition {groups!r}: host {i} is out of range or twice")
                seen.add(i)
        for g, group in enumerate(groups[1:], start=1):
            _ip("-n", self.switch, "link", "add", f"br{g}", "type", "bridge")
            _ip("-n", self.switch, "link", "set", f"br{g}", "up")
            for i in group:
                _ip("-n", self.switch, "link", "set", f"p{i}", "master", f"br{g}")

    def heal(self) -> None:
        """Undo ``partition``: every host's port back on the one bridge, and every host's
        neighbour cache flushed (addresses that failed to resolve meanwhile would be
        "no route to host" for a few seconds more)."""
        out = _ip("-n", self.switch, "-o", "link", "show", "type", "bridge").stdout
        extra = [ln.split(":")[1].strip() for ln in out.splitlines() if ":" in ln]
        extra = [b for b in extra if b != "br0"]
        for bridge in extra:
            _ip("-n", self.switch, "link", "del", bridge)
        if extra:
            for i, name in enumerate(self.names):
                _ip("-n", self.switch, "link", "set", f"p{i}", "master", "br0")
                _ip("-n", name, "neigh", "flush", "all", check=False)


# -- daemons a test starts on its hosts -------------------------------------------------------
def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """TERM the process group ``proc`` leads (``popen`` starts each command in a session of
    its own: a daemon's children are in it too), then KILL what is left; always reaped."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    try:                        # children that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def write_json(folder: str | os.PathLike[str], name: str, data: Any) -> None:
    """Write ``data`` as ``folder/name`` (a rank's result for its test's driver) whole or
    not at all: the driver polls for the file and must never read half of it."""
    tmp = os.path.join(folder, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(folder, name))


def driver_results(driver: subprocess.Popen, log: str | os.PathLike[str],
                   limit: float) -> Any:
    """The JSON of the last line a test's driver program printed into ``log``, once it exited
    0 within ``limit`` seconds (AssertionError with the log's tail otherwise; the caller's
    ``stop_group`` reaps a driver that did not finish)."""
    try:
        code = driver.wait(limit)
    except subprocess.TimeoutExpired:
        code = None
    output = Path(log).read_text(errors="replace")
    assert code == 0, f"driver exit code {code}:\n{output[-5000:]}"
    return json.loads(output.strip().splitlines()[-1])


def wait_for_text(path: str | os.PathLike[str], text: str, proc: subprocess.Popen,
                  limit: float) -> None:
    """Wait until ``text`` appears in the log file ``path`` of ``proc`` (a daemon saying it
    is ready); AssertionError with the log's tail if ``proc`` exits or ``limit`` passes."""
    deadline = time.monotonic() + limit
    log = Path(path)
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not seen in {log.name} within {limit:g} s "
                         f"(exit code {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pycoll.testing.hosts",
                                     description="Run a command on each of K namespace hosts.")
    parser.add_argument("k", type=int)
    parser.add_argument("--rate", help="shape every host's link (e.g. 5gbit)")
    parser.add_argument("--delay", help="add latency to every host's link (e.g. 1ms)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        parser.error("give the command after --")
    ok, why = available()
    if not ok:
        print(f"namespace hosts unavailable: {why}", file=sys.stderr)
        return 2
    with NamespaceHosts(args.k, rate=args.rate, delay=args.delay) as hosts:
        procs = [hosts.popen(i, command, env=dict(os.environ, PYCOLL_TEST_HOST=str(i),
                                                     PYCOLL_TEST_HOSTS=",".join(hosts.addresses)))
                 for i in range(args.k)]
        return max(p.wait() for p in procs) if procs else 0


if __name__ == "__main__":
    sys.exit(main())
