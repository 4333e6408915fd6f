"""Helpers for the rendezvous tests: child processes, the CLI server, raw protocol sockets.

Every helper that starts a process or a socket bounds its waits and reaps what it started.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

from pycoll.testing import free_port as testing_free_port
from rendezvous import protocol as P

HOST = "127.0.0.1"

PRELUDE = textwrap.dedent(
    """
    import os, sys, time, threading, resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (min(hard, 8192) if hard != resource.RLIM_INFINITY else 8192, hard))
    threading.stack_size(256 * 1024)
    import rendezvous
    from rendezvous import *
    """
)


def raise_nofile(want: int = 8192) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.pop("PYCOLL_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def spawn(code: str, *args: object, env: dict | None = None,
          stdin: bool = False) -> subprocess.Popen:
    """Start ``python -c PRELUDE+code args...``; stdout/stderr captured as text."""
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        text=True,
        env=env if env is not None else child_env(),
    )


def finish(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, str, str]:
    """Wait for ``proc`` with a deadline; kill it if it overruns. Always reaps."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        raise AssertionError(f"child overran {timeout}s; stdout={out[-2000:]!r} "
                             f"stderr={err[-2000:]!r}") from None
    return proc.returncode, out, err


def run_child(code: str, *args: object, timeout: float = 60.0, env: dict | None = None) -> str:
    """Run a child to completion; assert exit 0; return its stdout."""
    rc, out, err = finish(spawn(code, *args, env=env), timeout)
    assert rc == 0, f"child failed rc={rc}\nstdout={out[-3000:]}\nstderr={err[-3000:]}"
    return out


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen) -> Iterator[None]:
    """Kill and reap any of ``procs`` still running when the block exits."""
    try:
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            try:
                p.communicate(timeout=10)
            except Exception:
                pass


def read_line(stream, timeout: float) -> str:
    """Read one line from a pipe with a deadline (the writer flushes whole lines)."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError(f"no line within {timeout}s")
        return stream.readline()
    finally:
        sel.close()


@contextlib.contextmanager
def cli_server(*extra: str, host: str = HOST,
               env: dict | None = None) -> Iterator[tuple[subprocess.Popen, int]]:
    """Run ``python -m rendezvous serve`` and yield (process, port). Reaped on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rendezvous", "serve", "--host", host, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env if env is not None else child_env(),
        preexec_fn=lambda: raise_nofile(8192),
    )
    try:
        line = read_line(proc.stdout, 30)
        assert line.startswith("rendezvous listening on "), line
        port = int(line.strip().rsplit(":", 1)[1])
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        try:
            proc.communicate(timeout=10)
        except Exception:
            pass


def free_port() -> int:
    return testing_free_port(HOST)


# ---------------------------------------------------------------------- raw protocol


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"EOF after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def recv_frame(sock: socket.socket) -> bytes:
    (n,) = P.FRAME_HEADER.unpack(recv_exact(sock, 4))
    return recv_exact(sock, n)


def raw_connect(port: int, host: str = HOST, timeout: float = 10.0) -> tuple[socket.socket, bytes]:
    """Connect and read the server's HELLO; returns (socket, server nonce)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    hello = recv_frame(sock)
    magic, version, flags, max_key, max_value, nonce = P.HELLO.unpack(hello)
    assert magic == P.MAGIC
    return sock, nonce


def raw_login(port: int, token: bytes | None = None, timeout: float = 10.0) -> socket.socket:
    """A raw connection that has completed the handshake (ready for request frames)."""
    sock, snonce = raw_connect(port, timeout=timeout)
    cnonce = os.urandom(32)
    mac = P.client_mac(token, snonce, cnonce) if token else b""
    login = P.LOGIN_FIXED.pack(P.MAGIC, P.VERSION, cnonce, len(mac)) + mac
    sock.sendall(P.FRAME_HEADER.pack(len(login)) + login)
    status, _ = P.WELCOME_FIXED.unpack_from(recv_frame(sock), 0)
    assert status == P.WelcomeStatus.OK
    return sock


def wait_closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True once the server has closed ``sock`` (EOF or reset), reading and discarding data."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
        if not data:
            return True
    return False


def wait_until(pred, timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll ``pred`` (test-side observation only) until true or the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())
