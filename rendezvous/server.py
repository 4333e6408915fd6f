"""The rendezvous store server: one ``selectors`` event loop, no thread per client.

Why an event loop: a job of N ranks keeps N connections open for its whole life and most of
them sit idle in a blocking ``get``/``wait``. A thread per client (c10d's legacy backend) costs a
stack and a scheduler slot each and fell over past ~1K ranks; one ``epoll`` loop holds thousands
of idle sockets for the price of a dict entry each (the reason c10d moved its TCPStore server
to libuv, per PyTorch's "TCPStore libuv backend" tutorial).

Why waits are server-side: a ``get`` of a missing key parks a *waiter* on that key and the
server answers the moment some client sets it, with no polling traffic. The data, the
commands' semantics and the waits are ``kv.KeyValueState``, shared with ``LocalStore``; this
module is the network around it: connections, authentication, limits, deadlines.

Why it is paranoid: the port is reachable by anything on the network. Every connection must
authenticate within a deadline before any command (when a token is set), frames are
length-prefixed and bounded, every malformed input closes only that one connection (with a
log line), and each connection processes one request at a time with bounded buffers, so a
client that floods or never reads cannot grow server memory without bound.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import resource
import secrets
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence

from . import protocol as P
from .kv import KeyValueState, NotAnInteger, Waiter
from .protocol import Op, Status
from .tls import TlsFiles, describe_tls_failure, resolve_tls

__all__ = ["StoreServer", "resolve_token"]

log = logging.getLogger("rendezvous.server")

_TLS = -1          # accepted by a TLS server, TLS handshake under way
_HANDSHAKE = 0
_READY = 1
#: a non-blocking socket has nothing for us now (the ssl ones for a TLS connection)
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
#: a client that left during its TLS handshake (a liveness probe): no warning
_GONE = (errno.ENOTCONN, errno.ECONNRESET, errno.EPIPE)

_RECV_SIZE = 256 * 1024
_ACCEPTS_PER_WAKEUP = 512


def resolve_token(token: str | bytes | None) -> bytes | None:
    """Token precedence shared by server and client: argument, else ``$PYCOLL_TOKEN``, else none.

    An explicit empty string means "no authentication" even when the variable is set.
    """
    if token is None:
        token = os.environ.get("PYCOLL_TOKEN")
        if token is None:
            return None
    if isinstance(token, str):
        token = token.encode("utf-8")
    return bytes(token) or None


#: leases one connection may hold (a lease costs the server a key and an entry per connection)
MAX_LEASES = 64


def _probe_idle(sock: socket.socket, every_ms: int) -> None:
    """Keepalive probes on an idle connection every ``every_ms`` (at least 1 s, the kernel's
    unit); three unanswered probes close it."""
    seconds = max(1, int(every_ms) // 1000)
    for level, name, value in ((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
                               (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), seconds),
                               (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None),
                                seconds),
                               (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3)):
        if name is not None:
            try:
                sock.setsockopt(level, name, value)
            except OSError:
                pass


def _fmt_addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(addr)


class _Hostile(Exception):
    """Input that breaks the protocol: log it and close that connection."""


class _Reject(Exception):
    """A well-formed but invalid request: answer ERROR and keep the connection."""


class _Conn:
    __slots__ = (
        "sock", "peer", "inbuf", "outbuf", "state", "nonce", "waiter",
        "closed", "writing", "close_after_flush", "leases",
    )

    def __init__(self, sock: socket.socket, peer: str, state: int) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.state = state
        self.nonce = secrets.token_bytes(P.NONCE_SIZE)
        self.waiter: _Parked | None = None
        self.closed = False
        self.writing = False
        self.close_after_flush = False
        #: key -> value to set when this connection closes (``Op.LEASE``)
        self.leases: dict[bytes, bytes] = {}


class _Parked(Waiter[bytes]):
    """A parked GET / WAIT / MULTI_GET: the connection to answer, and how."""

    __slots__ = ("conn", "op")

    def __init__(self, conn: _Conn, op: int, keys: list[bytes]) -> None:
        super().__init__(keys)
        self.conn = conn
        self.op = op


_LISTENER = object()
_WAKE = object()


def _fd_ceiling() -> int:
    """The descriptor number above which the process is short of descriptors: the soft
    RLIMIT_NOFILE less a reserve (64, or a quarter of a small limit) kept for the rest of the
    process. Descriptors are allocated lowest first, so a new one this high means few left."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return soft - min(64, soft // 4)


class StoreServer:
    """A standalone rendezvous server.

    The socket is bound and listening as soon as the object exists (so ``port`` is known and
    early clients queue in the backlog); requests are served once :meth:`start` (background
    daemon thread) or :meth:`serve_forever` (current thread) runs.

    Args:
        host: address to bind; explicit on purpose (``"127.0.0.1"``, ``"::1"``, ``"0.0.0.0"``).
        port: port to bind; 0 picks a free one (read it back from :attr:`port`).
        token: shared secret; ``None`` falls back to ``$PYCOLL_TOKEN``; ``""`` disables auth.
        max_key_size / max_value_size: per-key / per-value byte limits (announced to clients).
        max_frame_size: largest request accepted after authentication (bounds ``multi_set``).
        handshake_timeout: seconds a new connection gets to authenticate before being dropped.
        max_connections: connections beyond this are accepted and closed immediately.
        backlog: listen backlog (default: the system maximum, so a connect storm of thousands
            of ranks is queued rather than reset).
        tls: ``rendezvous.tls.TlsFiles`` to serve TLS 1.3 with client certificates; ``None``
            reads ``PYCOLL_TLS_CERT/KEY/CA``; ``False``: plain sockets.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | bytes | None = None,
        *,
        max_key_size: int = P.DEFAULT_MAX_KEY_SIZE,
        max_value_size: int = P.DEFAULT_MAX_VALUE_SIZE,
        max_frame_size: int | None = None,
        handshake_timeout: float = 10.0,
        max_connections: int = 65536,
        backlog: int | None = None,
        tls: TlsFiles | bool | None = None,
    ) -> None:
        if max_key_size <= 0 or max_value_size < 0:
            raise ValueError("max_key_size must be > 0 and max_value_size >= 0")
        self._token = resolve_token(token)
        files = resolve_tls(tls)
        self._tls = files.server_context() if files is not None else None
        self.max_key_size = int(max_key_size)
        self.max_value_size = int(max_value_size)
        self.max_frame_size = int(
            max_frame_size if max_frame_size is not None
            else max_value_size + max_key_size + (1 << 20)
        )
        self.handshake_timeout = float(handshake_timeout)
        self.max_connections = int(max_connections)

        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        if not infos:  # pragma: no cover - getaddrinfo raises instead
            raise OSError(f"cannot resolve {host!r}")
        family, stype, proto, _, sockaddr = infos[0]
        lsock = socket.socket(family, stype, proto)
        try:
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and sockaddr[0] in ("::", ""):
                lsock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            lsock.bind(sockaddr)
            lsock.listen(backlog if backlog is not None else socket.SOMAXCONN)
            lsock.setblocking(False)
        except BaseException:
            lsock.close()
            raise
        self._lsock = lsock
        self.host: str = host
        self.port: int = lsock.getsockname()[1]

        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(lsock, selectors.EVENT_READ, _LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)

        self._kv: KeyValueState[bytes] = KeyValueState(self._on_ready)
        self._conns: dict[int, _Conn] = {}
        #: key -> the connection whose lease sets it at close (the latest lease taken on it)
        self._lease_holders: dict[bytes, _Conn] = {}
        self._timers: list[tuple[float, int, object]] = []
        self._seq = itertools.count()
        self._resume: list[_Conn] = []
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop_done = threading.Event()
        self._loop_started = False
        self._cleaned = False
        self._cleanup_lock = threading.Lock()
        self._handlers: dict[int, Callable[[_Conn, int, list[bytes]], None]] = {
            Op.PING: self._op_ping,
            Op.SET: self._op_set,
            Op.COMPARE_SET: self._op_compare_set,
            Op.GET: lambda c, a, b: self._op_wait_like(c, Op.GET, a, b),
            Op.ADD: self._op_add,
            Op.CHECK: self._op_check,
            Op.WAIT: lambda c, a, b: self._op_wait_like(c, Op.WAIT, a, b),
            Op.NUM_KEYS: self._op_num_keys,
            Op.DELETE: self._op_delete,
            Op.APPEND: self._op_append,
            Op.MULTI_GET: lambda c, a, b: self._op_wait_like(c, Op.MULTI_GET, a, b),
            Op.MULTI_SET: self._op_multi_set,
            Op.LEASE: self._op_lease,
        }

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 hosts in brackets), as printed by the CLI."""
        return _fmt_addr((self.host, self.port))

    @property
    def num_connections(self) -> int:
        """Number of open client connections (approximate when read from another thread)."""
        return len(self._conns)

    @property
    def auth_required(self) -> bool:
        return self._token is not None

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` now, or None: for the process hosting the server (a launcher
        reading the job's abort record), without a client connection. Safe from any thread
        (one dict read)."""
        return self._kv.data.get(key.encode("utf-8"))

    def start(self) -> StoreServer:
        """Serve on a background daemon thread; returns ``self``."""
        if self._thread is not None or self._loop_started:
            raise RuntimeError("server already started")
        self._thread = threading.Thread(
            target=self.serve_forever, name=f"rendezvous-server-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Run the event loop in the calling thread until :meth:`stop` / :meth:`close`."""
        if self._loop_started:
            raise RuntimeError("server already started")
        self._loop_started = True
        try:
            while not self._stopping:
                try:
                    self._run_once()
                except Exception:  # the server must survive anything one client does
                    log.exception("rendezvous server: unexpected error in event loop (continuing)")
        finally:
            self._cleanup()
            self._loop_done.set()

    def stop(self) -> None:
        """Ask the loop to exit; safe from any thread and from signal handlers."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, close every connection and the listening socket."""
        self.stop()
        if self._loop_started:
            if threading.current_thread() is not self._thread:
                self._loop_done.wait(timeout)
        else:
            self._cleanup()

    def __enter__(self) -> StoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cleanup(self) -> None:
        with self._cleanup_lock:
            if self._cleaned:
                return
            self._cleaned = True
        for conn in list(self._conns.values()):
            self._close(conn, None)
        for s in (self._lsock, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        try:
            self._sel.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ event loop

    def _run_once(self) -> None:
        timeout = None
        if self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        for key, mask in self._sel.select(timeout):
            data = key.data
            if data is _LISTENER:
                self._accept()
            elif data is _WAKE:
                try:
                    while self._wake_r.recv(4096):
                        pass
                except OSError:
                    pass
            else:
                conn: _Conn = data
                if conn.closed:
                    continue
                self._guarded(conn, self._on_events, conn, mask)
            self._drain_resume()
        self._run_timers()
        self._drain_resume()

    def _drain_resume(self) -> None:
        # Connections whose parked request completed may have further requests buffered.
        while self._resume:
            conn = self._resume.pop()
            if conn.closed:
                continue
            self._guarded(conn, self._process, conn)

    def _on_events(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:
            self._on_writable(conn)
        if mask & selectors.EVENT_READ and not conn.closed:
            self._on_readable(conn)

    def _guarded(self, conn: _Conn, fn: Callable[..., None], *args: object) -> None:
        """Run ``fn``; a hostile frame or any error closes only this connection, logged."""
        try:
            fn(*args)
        except _Hostile as e:
            log.warning("rendezvous server: closing connection from %s: %s", conn.peer, e)
            self._close(conn, None)
        except Exception:
            log.exception("rendezvous server: error on connection from %s; closing it", conn.peer)
            self._close(conn, None)

    def _push_timer(self, deadline: float, obj: object) -> None:
        heapq.heappush(self._timers, (deadline, next(self._seq), obj))

    def _run_timers(self) -> None:
        timers = self._timers
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            _, _, obj = heapq.heappop(timers)
            if isinstance(obj, _Parked):
                if obj.active:
                    self._expire_waiter(obj)
            elif isinstance(obj, _Conn):
                if not obj.closed and obj.state != _READY:
                    log.warning(
                        "rendezvous server: dropping connection from %s: no handshake within %.1fs",
                        obj.peer, self.handshake_timeout,
                    )
                    self._close(obj, None)
            elif obj is _LISTENER:
                try:
                    self._sel.register(self._lsock, selectors.EVENT_READ, _LISTENER)
                except (KeyError, ValueError):
                    pass
        # Completed waiters leave their (long) deadlines in the heap; compact when they dominate.
        if len(timers) > 4096:
            live = [t for t in timers if self._timer_live(t[2])]
            if len(live) * 2 < len(timers):
                heapq.heapify(live)
                self._timers = live

    @staticmethod
    def _timer_live(obj: object) -> bool:
        if isinstance(obj, _Parked):
            return obj.active
        if isinstance(obj, _Conn):
            return not obj.closed and obj.state != _READY
        return True

    # ------------------------------------------------------------------ connections

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, addr = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: make room by dropping connections that never
                    # authenticated (a flood of idle strangers), so the job's own clients
                    # keep being served; if there are none, stop accepting briefly instead
                    # of spinning on a listener that stays readable.
                    if self._evict_unauthenticated(max(1, len(self._conns) // 4)):
                        continue
                    log.error("rendezvous server: accept failed (%s); pausing accepts for "
                              "100 ms", e)
                    try:
                        self._sel.unregister(self._lsock)
                    except (KeyError, ValueError):
                        pass
                    self._push_timer(time.monotonic() + 0.1, _LISTENER)
                else:
                    log.warning("rendezvous server: accept failed: %s", e)
                return
            peer = _fmt_addr(addr)
            if len(self._conns) >= self.max_connections:
                self._evict_unauthenticated(1)      # an idle stranger makes room, not a rank
            if sock.fileno() >= _fd_ceiling():
                # Descriptors run short for the whole process (the store lives in a rank,
                # which still opens files, sockets and segments): strangers go first, before
                # the process itself hits EMFILE.
                self._evict_unauthenticated(max(1, len(self._conns) // 4))
            if len(self._conns) >= self.max_connections:
                log.warning(
                    "rendezvous server: refusing connection from %s: %d connections open "
                    "(max_connections)",
                    peer, len(self._conns),
                )
                sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                sock.close()
                continue
            if self._tls is not None:
                try:
                    sock = self._start_tls(sock)
                except OSError:
                    sock.close()
                    continue
            conn = _Conn(sock, peer, _HANDSHAKE if self._tls is None else _TLS)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            if self._tls is None:
                self._hello(conn)
            self._push_timer(time.monotonic() + self.handshake_timeout, conn)

    def _hello(self, conn: _Conn) -> None:
        flags = P.FLAG_AUTH_REQUIRED if self._token is not None else 0
        hello = P.HELLO.pack(P.MAGIC, P.VERSION, flags, self.max_key_size,
                             self.max_value_size, conn.nonce)
        self._send(conn, P.FRAME_HEADER.pack(len(hello)) + hello)

    def _start_tls(self, sock: socket.socket) -> ssl.SSLSocket:
        """Say in the clear that this store speaks TLS (a client without certificates then
        knows why it is refused), and wrap the socket for a non-blocking handshake."""
        notice = P.HELLO.pack(P.MAGIC, P.VERSION, P.FLAG_TLS_REQUIRED, 0, 0, bytes(P.NONCE_SIZE))
        sock.send(P.FRAME_HEADER.pack(len(notice)) + notice)   # 54 bytes, an empty buffer
        assert self._tls is not None
        return self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)

    def _tls_handshake(self, conn: _Conn) -> None:
        """One step of a connection's TLS handshake; once done, the HELLO goes out inside."""
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            conn.writing = True
            self._sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        except OSError as e:
            if isinstance(e, ssl.SSLEOFError) or e.errno in _GONE:   # connected, left (a probe)
                self._close(conn, None)
                return
            raise _Hostile(describe_tls_failure(e)) from None   # a stranger, another CA's
        if conn.writing:
            conn.writing = False
            self._sel.modify(sock, selectors.EVENT_READ, conn)
        conn.state = _HANDSHAKE
        self._hello(conn)

    def _evict_unauthenticated(self, count: int) -> int:
        """Close up to ``count`` of the oldest connections still in their handshake (never an
        authenticated client); return how many were closed."""
        victims = [c for c in self._conns.values() if c.state != _READY][:count]
        for conn in victims:
            self._close(conn, None)
        if victims:
            log.warning("rendezvous server: short of connections/descriptors: dropped %d "
                        "connection(s) that had not authenticated", len(victims))
        return len(victims)

    def _close(self, conn: _Conn, reason: str | None) -> None:
        if conn.closed:
            return
        conn.closed = True
        if reason:
            log.warning("rendezvous server: closing connection from %s: %s", conn.peer, reason)
        w = conn.waiter
        if w is not None:
            self._kv.cancel(w)
            conn.waiter = None
        try:
            fd = conn.sock.fileno()
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            fd = -1
        self._conns.pop(fd, None)
        try:
            conn.sock.close()
        except OSError:
            pass
        conn.inbuf = bytearray()
        conn.outbuf = bytearray()
        leases, conn.leases = conn.leases, {}
        for key, value in leases.items():      # the holder is gone: say so, waking waiters
            if self._lease_holders.get(key) is conn:    # unless a newer lease holds the key
                del self._lease_holders[key]
                self._kv.set(key, value)

    def _send(self, conn: _Conn, data: bytes) -> None:
        if conn.closed:
            return
        if conn.outbuf:
            conn.outbuf += data
            return
        try:
            sent = conn.sock.send(data)
        except _WOULD_BLOCK:
            sent = 0
        except OSError as e:
            self._close(conn, None)
            log.debug("rendezvous server: send to %s failed: %s", conn.peer, e)
            return
        if sent < len(data):
            conn.outbuf += memoryview(data)[sent:]
            if not conn.writing:
                conn.writing = True
                self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        elif conn.close_after_flush:
            self._close(conn, None)

    def _on_writable(self, conn: _Conn) -> None:
        if conn.state == _TLS:
            self._tls_handshake(conn)
            return
        if conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except _WOULD_BLOCK:
                return
            except OSError:
                self._close(conn, None)
                return
            del conn.outbuf[:sent]
        if not conn.outbuf:
            if conn.close_after_flush:
                self._close(conn, None)
                return
            conn.writing = False
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            self._process(conn)

    def _on_readable(self, conn: _Conn) -> None:
        if conn.state == _TLS:
            self._tls_handshake(conn)
            return
        try:
            data = conn.sock.recv(_RECV_SIZE)
            if self._tls is not None:    # a record decrypted but not all read: epoll can't see
                while data and conn.sock.pending():   # type: ignore[attr-defined]
                    data += conn.sock.recv(_RECV_SIZE)
        except _WOULD_BLOCK:
            return
        except OSError as e:
            log.debug("rendezvous server: recv from %s failed: %s", conn.peer, e)
            self._close(conn, None)
            return
        if not data:
            if conn.state == _HANDSHAKE and conn.inbuf:
                log.warning(
                    "rendezvous server: connection from %s closed mid-handshake (truncated "
                    "frame)", conn.peer
                )
            elif conn.inbuf:
                log.warning(
                    "rendezvous server: connection from %s closed with a truncated frame (%d "
                    "bytes pending)",
                    conn.peer, len(conn.inbuf),
                )
            self._close(conn, None)
            return
        conn.inbuf += data
        limit = P.MAX_HANDSHAKE_FRAME if conn.state == _HANDSHAKE else self.max_frame_size
        if len(conn.inbuf) > limit + P.FRAME_HEADER.size + _RECV_SIZE:
            # Only possible when the client pipelines while a request is parked or a reply is
            # unread; our client never does, so this is a flood.
            raise _Hostile(f"{len(conn.inbuf)} unprocessed bytes buffered (flooding)")
        self._process(conn)

    def _process(self, conn: _Conn) -> None:
        """Handle complete frames in order, one request at a time per connection."""
        buf = conn.inbuf
        hdr = P.FRAME_HEADER.size
        while not conn.closed and conn.waiter is None and not conn.outbuf and len(buf) >= hdr:
            (n,) = P.FRAME_HEADER.unpack_from(buf, 0)
            if conn.state == _HANDSHAKE:
                if n > P.MAX_HANDSHAKE_FRAME:
                    raise _Hostile(f"oversized handshake frame ({n} bytes announced)")
            elif n > self.max_frame_size:
                raise _Hostile(f"oversized frame ({n} bytes announced, "
                               f"max_frame_size={self.max_frame_size})")
            if len(buf) < hdr + n:
                return
            payload = bytes(buf[hdr:hdr + n])
            del buf[:hdr + n]
            if conn.state == _HANDSHAKE:
                self._on_login(conn, payload)
            else:
                self._dispatch(conn, payload)

    # ------------------------------------------------------------------ handshake

    def _on_login(self, conn: _Conn, payload: bytes) -> None:
        fixed = P.LOGIN_FIXED.size
        if len(payload) < fixed:
            raise _Hostile(f"malformed handshake ({len(payload)} bytes)")
        magic, version, cnonce, maclen = P.LOGIN_FIXED.unpack_from(payload, 0)
        if magic != P.MAGIC:
            raise _Hostile("bad magic in handshake (not a rendezvous client)")
        if len(payload) != fixed + maclen:
            raise _Hostile("malformed handshake (length mismatch)")
        if version != P.VERSION:
            log.warning(
                "rendezvous server: rejecting %s: protocol version %d, server speaks %d",
                conn.peer, version, P.VERSION,
            )
            self._welcome(conn, P.WelcomeStatus.BAD_VERSION, b"", close=True)
            return
        mac = payload[fixed:]
        if self._token is not None:
            expected = P.client_mac(self._token, conn.nonce, cnonce)
            if not mac or not secrets.compare_digest(mac, expected):
                log.warning(
                    "rendezvous server: authentication failed for %s (%s token)",
                    conn.peer, "missing" if not mac else "wrong",
                )
                self._welcome(conn, P.WelcomeStatus.AUTH_FAILED, b"", close=True)
                return
            proof = P.server_mac(self._token, conn.nonce, cnonce)
        else:
            proof = b""
        conn.state = _READY
        self._welcome(conn, P.WelcomeStatus.OK, proof, close=False)

    def _welcome(self, conn: _Conn, status: int, mac: bytes, close: bool) -> None:
        body = P.WELCOME_FIXED.pack(status, len(mac)) + mac
        if close:
            conn.close_after_flush = True
        self._send(conn, P.FRAME_HEADER.pack(len(body)) + body)

    # ------------------------------------------------------------------ requests

    def _dispatch(self, conn: _Conn, payload: bytes) -> None:
        try:
            op, arg, blobs = P.decode_message(payload)
        except P.MalformedFrame as e:
            raise _Hostile(f"malformed request: {e}") from None
        handler = self._handlers.get(op)
        if handler is None:
            self._reply_error(conn, f"unknown command {op}")
            raise _Hostile(f"unknown command {op}")
        try:
            handler(conn, arg, blobs)
        except _Reject as e:
            self._reply_error(conn, str(e))

    def _reply(self, conn: _Conn, arg: int = 0, blobs: Sequence[bytes] = ()) -> None:
        self._send(conn, P.encode_message(Status.OK, arg, blobs))

    def _reply_error(self, conn: _Conn, message: str) -> None:
        self._send(conn, P.encode_message(Status.ERROR, 0, [message.encode("utf-8", "replace")]))

    def _check_key(self, key: bytes) -> None:
        if len(key) > self.max_key_size:
            raise _Reject(f"key of {len(key)} bytes exceeds max_key_size={self.max_key_size}")

    def _check_value(self, value: bytes) -> None:
        if len(value) > self.max_value_size:
            raise _Reject(f"value of {len(value)} bytes exceeds "
                          f"max_value_size={self.max_value_size}")

    @staticmethod
    def _arity(blobs: list[bytes], n: int, name: str) -> None:
        if len(blobs) != n:
            raise _Hostile(f"{name} expects {n} fields, got {len(blobs)}")

    def _op_ping(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._reply(conn, arg)

    def _op_set(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._arity(blobs, 2, "SET")
        key, value = blobs
        self._check_key(key)
        self._check_value(value)
        self._kv.set(key, value)
        self._reply(conn)

    def _op_compare_set(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._arity(blobs, 3, "COMPARE_SET")
        key, expected, desired = blobs
        self._check_key(key)
        self._check_value(desired)
        self._reply(conn, 0, [self._kv.compare_set(key, expected, desired)])

    def _op_add(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._arity(blobs, 1, "ADD")
        (key,) = blobs
        self._check_key(key)
        try:
            value = self._kv.add(key, arg)
        except NotAnInteger as e:
            raise _Reject(str(e)) from None
        self._reply(conn, value)

    def _op_check(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._reply(conn, int(self._kv.has_all(blobs)))

    def _op_num_keys(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._reply(conn, len(self._kv.data))

    def _op_delete(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._arity(blobs, 1, "DELETE")
        self._reply(conn, int(self._kv.delete(blobs[0])))

    def _op_append(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        self._arity(blobs, 2, "APPEND")
        key, value = blobs
        self._check_key(key)
        new = self._kv.appended(key, value)
        self._check_value(new)
        self._kv.set(key, new)
        self._reply(conn)

    def _op_multi_set(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        if len(blobs) % 2:
            raise _Hostile(f"MULTI_SET expects an even number of fields, got {len(blobs)}")
        half = len(blobs) // 2
        keys, values = blobs[:half], blobs[half:]
        for k in keys:
            self._check_key(k)
        for v in values:
            self._check_value(v)
        self._kv.multi_set(keys, values)
        self._reply(conn)

    # ------------------------------------------------------------------ server-side waits

    def _op_lease(self, conn: _Conn, arg: int, blobs: list[bytes]) -> None:
        """``key = value`` now and ``key = on_close`` when this connection closes: a process
        holding the connection is alive while the key says so (the kernel closes a dead
        process's socket at once). ``arg`` > 0: probe the idle connection every ``arg`` ms
        (TCP keepalive), so a holder behind a pulled cable is declared gone too."""
        self._arity(blobs, 3, "LEASE")
        key, value, on_close = blobs
        self._check_key(key)
        self._check_value(value)
        self._check_value(on_close)
        if key not in conn.leases and len(conn.leases) >= MAX_LEASES:
            raise _Reject(f"a connection holds at most {MAX_LEASES} leases")
        if arg > 0:
            _probe_idle(conn.sock, arg)
        self._kv.set(key, value)
        conn.leases[key] = on_close
        earlier = self._lease_holders.get(key)
        if earlier is not None and earlier is not conn:
            earlier.leases.pop(key, None)     # the key's lease passes to this connection
        self._lease_holders[key] = conn
        self._reply(conn)

    def _op_wait_like(self, conn: _Conn, op: int, arg: int, blobs: list[bytes]) -> None:
        if op == Op.GET:
            self._arity(blobs, 1, "GET")
        if blobs and max(map(len, blobs)) > self.max_key_size:
            raise _Reject(f"a key exceeds max_key_size={self.max_key_size}")
        if self._kv.has_all(blobs):
            self._complete(conn, op, blobs)
            return
        if arg == 0:
            self._reply_timeout(conn, blobs)
            return
        w = _Parked(conn, op, blobs)
        self._kv.park(w)
        conn.waiter = w
        if arg > 0:  # negative: no server-side deadline
            self._push_timer(time.monotonic() + arg / 1000.0, w)

    def _on_ready(self, w: Waiter[bytes]) -> None:
        """A parked request's keys all exist: answer it, then serve what its client sent
        after it (``_drain_resume``)."""
        assert isinstance(w, _Parked)
        conn = w.conn
        conn.waiter = None
        self._complete(conn, w.op, w.keys)
        self._resume.append(conn)

    def _complete(self, conn: _Conn, op: int, keys: Sequence[bytes]) -> None:
        if op == Op.WAIT:
            self._reply(conn)
        else:
            self._reply(conn, 0, self._kv.values(keys))

    def _expire_waiter(self, w: _Parked) -> None:
        self._kv.cancel(w)
        conn = w.conn
        conn.waiter = None
        self._reply_timeout(conn, w.keys)
        self._resume.append(conn)

    def _reply_timeout(self, conn: _Conn, keys: Sequence[bytes]) -> None:
        self._send(conn, P.encode_message(Status.TIMEOUT, 0, self._kv.missing(keys)))
