"""The rendezvous store client, :class:`TCPStore`.

One blocking TCP connection per client object, with a lock around every call so the object can
be shared by threads (the pycoll communicator has a worker thread). Every call has a deadline:
blocking calls (``get``, ``wait``, ``multi_get``) send their deadline to the server, which
answers TIMEOUT with the keys still missing, so the client can say exactly which ranks never
showed up; the socket timeout is only a backstop against a hung server.
"""

from __future__ import annotations

import datetime
import math
import random
import secrets
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Iterable, Sequence

from . import protocol as P
from .errors import (
    AuthError,
    StoreConnectError,
    StoreConnectionLost,
    StoreError,
    StoreLimitError,
    StoreProtocolError,
    StoreTimeout,
)
from .protocol import Op, Status
from .server import StoreServer, resolve_token
from .tls import TLS_VARIABLES, TlsFiles, describe_tls_failure, resolve_tls

__all__ = ["TCPStore", "Timeout", "Value"]

Timeout = float | int | datetime.timedelta | None
Value = bytes | bytearray | memoryview | str

#: extra seconds the client waits past a server-side deadline before declaring the server hung.
_REPLY_GRACE = 5.0
_BACKOFF_START = 0.01
_BACKOFF_MAX = 1.0


def _seconds(timeout: Timeout, default: float) -> float:
    if timeout is None:
        return default
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _key(key: str) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8")
    raise TypeError(f"store keys must be str, got {type(key).__name__}")


def _value(value: Value) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store values must be bytes or str, got {type(value).__name__}")


def _fmt_keys(keys: Sequence[bytes], limit: int = 8) -> str:
    shown = ", ".join(repr(k.decode("utf-8", "replace")) for k in keys[:limit])
    if len(keys) > limit:
        shown += f", ... ({len(keys) - limit} more)"
    return "[" + shown + "]"


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        r = sock.recv_into(view[got:], n - got)
        if r == 0:
            raise ConnectionResetError("connection closed by the server")
        got += r
    return buf


def _recv_frame(sock: socket.socket, limit: int) -> bytearray:
    (n,) = P.FRAME_HEADER.unpack(_recv_exact(sock, P.FRAME_HEADER.size))
    if n > limit:
        raise StoreProtocolError(f"server sent an oversized frame ({n} bytes)")
    return _recv_exact(sock, n)


class TCPStore:
    """Client of a rendezvous store server (and optionally its host).

    Args:
        host: server address (``"127.0.0.1"``, ``"::1"``, a hostname).
        port: server port; with ``is_server=True``, 0 picks a free port (see :attr:`port`).
        is_server: start a :class:`StoreServer` in this process on a background daemon thread
            (bound to ``host``) and connect to it, like c10d's ``is_master``.
        token: shared secret; ``None`` falls back to ``$PYCOLL_TOKEN``; ``""`` disables auth.
        timeout: default deadline in seconds (or a ``timedelta``) for connecting and for every
            call; blocking calls also accept a per-call ``timeout=``.
        server_options: extra keyword arguments for the embedded :class:`StoreServer`
            (``max_value_size=``, ``handshake_timeout=``, ...).
        tls: ``rendezvous.tls.TlsFiles`` (TLS 1.3, this client's certificate, the job's CA);
            ``None`` reads ``PYCOLL_TLS_CERT/KEY/CA``; ``False``: plain sockets. A client with
            TLS refuses a server without it, and the other way round, with an ``AuthError``.

    Connecting retries with exponential backoff plus jitter until the deadline, because ranks
    start in any order and the server may come up last; the jitter keeps thousands of ranks
    from hammering the listen backlog in lockstep (pytorch #129261).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        is_server: bool = False,
        token: str | bytes | None = None,
        timeout: Timeout = 300.0,
        server_options: dict | None = None,
        tls: TlsFiles | bool | None = None,
    ) -> None:
        self._timeout = _seconds(timeout, 300.0)
        self._token = resolve_token(token)
        files = resolve_tls(tls)
        self._tls = files.client_context() if files is not None else None
        self._lock = threading.RLock()
        self._sock: socket.socket | None = None
        self._closed = False
        self._max_key = P.DEFAULT_MAX_KEY_SIZE
        self._max_value = P.DEFAULT_MAX_VALUE_SIZE
        self.host = host
        self.server: StoreServer | None = None
        if is_server:
            # The embedded server uses exactly the token this client resolved, so the two
            # always agree (an explicit token=None still honours $PYCOLL_TOKEN for both).
            self.server = StoreServer(
                host, port, token=self._token or b"", tls=files or False,
                **(server_options or {})
            ).start()
            port = self.server.port
            self._finalizer = weakref.finalize(self, self.server.close)
        self.port = int(port)
        try:
            with self._lock:
                self._connect(time.monotonic() + self._timeout)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ properties

    @property
    def timeout(self) -> float:
        """Default deadline in seconds for calls that get no ``timeout=``."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: Timeout) -> None:
        self._timeout = _seconds(value, self._timeout)

    def set_timeout(self, timeout: Timeout) -> None:
        """c10d-style setter for :attr:`timeout`."""
        self.timeout = timeout

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def clone(self, timeout: Timeout) -> TCPStore:
        """A second connection to the same server with the same token (e.g. to post an
        abort record while this one is busy in a blocking call)."""
        return TCPStore(self.host, self.port, token=self._token if self._token is not None else "",
                        timeout=timeout)

    # ------------------------------------------------------------------ connection

    def _connect(self, deadline: float) -> None:
        """Connect and authenticate, retrying transient failures until ``deadline``."""
        start = time.monotonic()
        delay = _BACKOFF_START
        attempts = 0
        last: BaseException | None = None
        while True:
            attempts += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock = None
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=min(remaining, 30.0))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(min(max(deadline - time.monotonic(), 0.001), 30.0))
                sock = self._handshake(sock)
                sock.settimeout(None)
                self._sock = sock
                return
            except AuthError:
                if sock is not None:
                    sock.close()
                raise
            except (OSError, StoreProtocolError) as e:
                # Refused (server not up yet), reset (backlog overflow), timeouts, a server
                # that closed mid-handshake: all transient while the deadline allows.
                if sock is not None:
                    sock.close()
                last = e
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, _BACKOFF_MAX)
        elapsed = time.monotonic() - start
        raise StoreConnectError(
            f"could not connect to the rendezvous store at {self.address} after retrying for "
            f"{elapsed:.1f}s ({attempts} attempts); last error: {last!r}. Hint: check that the "
            f"server is running (rank 0 / the launcher with is_server=True, or `python -m "
            f"rendezvous serve`), that host and port are right and reachable from this machine, "
            f"and that the timeout ({self._timeout:g}s) leaves it enough time to start."
        )

    def _greeting(self, sock: socket.socket) -> tuple[int, int, int, bytes]:
        hello = _recv_frame(sock, P.MAX_HANDSHAKE_FRAME)
        if len(hello) != P.HELLO.size:
            raise StoreProtocolError(f"unexpected greeting from {self.address} "
                                     "(not a rendezvous server?)")
        magic, version, flags, max_key, max_value, snonce = P.HELLO.unpack(hello)
        if magic != P.MAGIC:
            raise StoreProtocolError(f"{self.address} is not a rendezvous server (bad magic)")
        return flags, max_key, max_value, snonce

    def _start_tls(self, sock: socket.socket, flags: int) -> ssl.SSLSocket:
        """The TLS handshake a TLS server announced (bounded by the socket's timeout); both
        ends must agree on TLS, a mismatch is refused with what to set."""
        if not flags & P.FLAG_TLS_REQUIRED:
            raise AuthError(
                f"the rendezvous store at {self.address} does not speak TLS but this client "
                f"has certificates ({', '.join(TLS_VARIABLES)}); refusing to talk in the "
                "clear. Give the server the same variables, or unset them here.")
        if self._tls is None:
            raise AuthError(
                f"the rendezvous store at {self.address} requires TLS and this client has no "
                f"certificates: set {', '.join(TLS_VARIABLES)} (a certificate signed by the "
                "job's CA, and that CA) as on the server")
        try:
            return self._tls.wrap_socket(sock)
        except ssl.SSLError as e:
            raise self._tls_refused(e) from None

    def _tls_refused(self, error: ssl.SSLError) -> AuthError:
        return AuthError(f"the rendezvous store at {self.address}: "
                         f"{describe_tls_failure(error)}")

    def _handshake(self, sock: socket.socket) -> socket.socket:
        """Greeting, TLS if the server speaks it, login; the socket to talk on."""
        flags, max_key, max_value, snonce = self._greeting(sock)
        if self._tls is not None or flags & P.FLAG_TLS_REQUIRED:
            sock = self._start_tls(sock, flags)
            try:
                flags, max_key, max_value, snonce = self._greeting(sock)
            except ssl.SSLError as e:     # TLS 1.3: the server checks our certificate now
                raise self._tls_refused(e) from None
        self._login(sock, flags, snonce)
        self._max_key, self._max_value = max_key, max_value
        return sock

    def _login(self, sock: socket.socket, flags: int, snonce: bytes) -> None:
        auth = bool(flags & P.FLAG_AUTH_REQUIRED)
        if self._token is not None and not auth:
            raise AuthError(
                f"the rendezvous server at {self.address} does not require a token but this client "
                f"has one (token argument or PYCOLL_TOKEN); refusing to talk to an unauthenticated "
                f"server. Start the server with the same token, or pass token='' to opt out."
            )
        cnonce = secrets.token_bytes(P.NONCE_SIZE)
        mac = P.client_mac(self._token, snonce, cnonce) if self._token is not None else b""
        login = P.LOGIN_FIXED.pack(P.MAGIC, P.VERSION, cnonce, len(mac)) + mac
        sock.sendall(P.FRAME_HEADER.pack(len(login)) + login)
        try:
            welcome = _recv_frame(sock, P.MAX_HANDSHAKE_FRAME)
        except ConnectionError:
            if auth and self._token is None:
                raise AuthError(
                    f"the rendezvous server at {self.address} requires a token and none was given "
                    f"(pass token= or set PYCOLL_TOKEN)"
                ) from None
            raise
        if len(welcome) < P.WELCOME_FIXED.size:
            raise StoreProtocolError("malformed handshake reply")
        status, maclen = P.WELCOME_FIXED.unpack_from(welcome, 0)
        proof = bytes(welcome[P.WELCOME_FIXED.size:])
        if status == P.WelcomeStatus.AUTH_FAILED:
            what = "no token was given" if self._token is None else "the token does not match"
            raise AuthError(
                f"the rendezvous server at {self.address} rejected this client: {what} "
                f"(pass token= or set PYCOLL_TOKEN to the job's token)"
            )
        if status == P.WelcomeStatus.BAD_VERSION:
            raise AuthError(f"the rendezvous server at {self.address} speaks another protocol "
                            "version")
        if status != P.WelcomeStatus.OK or len(proof) != maclen:
            raise StoreProtocolError("malformed handshake reply")
        if self._token is not None:
            expected = P.server_mac(self._token, snonce, cnonce)
            if not secrets.compare_digest(proof, expected):
                raise AuthError(f"the rendezvous server at {self.address} could not prove it "
                                "knows the token")

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    # ------------------------------------------------------------------ request engine

    def _call(
        self,
        op: int,
        arg: int,
        blobs: Sequence[bytes],
        timeout: float,
        wait_keys: Sequence[bytes] | None = None,
    ) -> tuple[int, list[bytes]]:
        """Send one request and return ``(arg, blobs)`` of its OK reply.

        ``wait_keys`` marks a server-side wait: ``timeout`` is sent along and a TIMEOUT reply
        becomes :class:`StoreTimeout`.
        """
        frame = P.encode_message(op, arg, blobs)
        with self._lock:
            if self._closed:
                raise StoreError("store is closed")
            deadline = time.monotonic() + timeout
            if self._sock is None:  # reconnect after a lost connection
                self._connect(deadline)
            sock = self._sock
            assert sock is not None
            grace = _REPLY_GRACE if wait_keys is not None else 0.0
            backstop = max(deadline - time.monotonic(), 0.0) + grace
            try:
                sock.settimeout(None if math.isinf(backstop) else max(backstop, 0.001))
                sock.sendall(frame)
                (n,) = P.FRAME_HEADER.unpack(_recv_exact(sock, P.FRAME_HEADER.size))
                if n > self._max_value + (1 << 30):
                    raise StoreProtocolError(f"server sent an oversized frame ({n} bytes)")
                payload = _recv_exact(sock, n)
            except TimeoutError:
                # The server did not answer in time: the connection state is unknown (a reply
                # may still arrive), so drop it; the next call reconnects.
                self._drop()
                keys = wait_keys if wait_keys is not None else blobs[:1]
                raise StoreTimeout(
                    f"{Op(op).name.lower()} on {self.address} got no reply within {timeout:g}s "
                    f"(keys {_fmt_keys(list(keys))})"
                ) from None
            except StoreError:
                self._drop()
                raise
            except OSError as e:
                self._drop()
                raise StoreConnectionLost(
                    f"connection to the rendezvous store at {self.address} was lost during "
                    f"{Op(op).name.lower()}: {e!r}. The server may have exited or closed this "
                    f"connection (see its log); the next call will try to reconnect."
                ) from None
        try:
            status, rarg, rblobs = P.decode_message(payload)
        except P.MalformedFrame as e:
            with self._lock:
                self._drop()
            raise StoreProtocolError(f"malformed reply from {self.address}: {e}") from None
        if status == Status.OK:
            return rarg, rblobs
        if status == Status.TIMEOUT:
            missing = rblobs if rblobs else list(wait_keys or ())
            raise StoreTimeout(
                f"timed out after {timeout:g}s waiting for keys {_fmt_keys(missing)} on the "
                f"rendezvous store at {self.address}"
                + (f" ({len(missing)} of {len(wait_keys)} requested keys missing)"
                   if wait_keys else "")
            )
        if status == Status.ERROR:
            msg = rblobs[0].decode("utf-8", "replace") if rblobs else "unknown error"
            raise StoreError(f"rendezvous store at {self.address} rejected "
                             f"{Op(op).name.lower()}: {msg}")
        raise StoreProtocolError(f"unknown reply status {status} from {self.address}")

    @staticmethod
    def _wait_ms(timeout: float) -> int:
        # Server-side deadline in ms: -1 = none (timeout=inf), 0 = check once and fail fast.
        if math.isinf(timeout):
            return -1
        return max(int(timeout * 1000), 1) if timeout > 0 else 0

    def _ck(self, key: str) -> bytes:
        k = _key(key)
        if len(k) > self._max_key:
            raise StoreLimitError(f"key of {len(k)} bytes exceeds the server's "
                                  f"max_key_size={self._max_key}")
        return k

    def _cv(self, value: Value) -> bytes:
        v = _value(value)
        if len(v) > self._max_value:
            raise StoreLimitError(f"value of {len(v)} bytes exceeds the server's "
                                  f"max_value_size={self._max_value}")
        return v

    # ------------------------------------------------------------------ public API

    def set(self, key: str, value: Value) -> None:
        """Store ``value`` under ``key`` and wake every waiter on it."""
        self._call(Op.SET, 0, [self._ck(key), self._cv(value)], self._timeout)

    def get(self, key: str, *, timeout: Timeout = None) -> bytes:
        """Return the value of ``key``, waiting (server-side) until it exists or the deadline."""
        t = _seconds(timeout, self._timeout)
        k = self._ck(key)
        _, blobs = self._call(Op.GET, self._wait_ms(t), [k], t, wait_keys=[k])
        return blobs[0]

    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (created at 0); return the result."""
        arg, _ = self._call(Op.ADD, int(amount), [self._ck(key)], self._timeout)
        return arg

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """c10d ``compareSet``: set ``key`` to ``desired`` if it currently equals ``expected``.

        A missing key counts as matching only an empty ``expected``. Returns the value stored
        afterwards: ``desired`` on success, the current value on mismatch, and ``expected``
        when the key is missing and ``expected`` is non-empty.
        """
        _, blobs = self._call(
            Op.COMPARE_SET, 0, [self._ck(key), _value(expected), self._cv(desired)], self._timeout
        )
        return blobs[0]

    def wait(self, keys: str | Iterable[str], timeout: Timeout = None) -> None:
        """Block until every key exists (server-side wait) or raise :class:`StoreTimeout`."""
        if isinstance(keys, str):
            keys = [keys]
        ks = [self._ck(k) for k in keys]
        t = _seconds(timeout, self._timeout)
        self._call(Op.WAIT, self._wait_ms(t), ks, t, wait_keys=ks)

    def check(self, keys: str | Iterable[str]) -> bool:
        """Return whether every key exists right now (never waits)."""
        if isinstance(keys, str):
            keys = [keys]
        arg, _ = self._call(Op.CHECK, 0, [self._ck(k) for k in keys], self._timeout)
        return bool(arg)

    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        arg, _ = self._call(Op.DELETE, 0, [self._ck(key)], self._timeout)
        return bool(arg)

    delete_key = delete  # c10d name

    def num_keys(self) -> int:
        """Number of keys in the whole store."""
        arg, _ = self._call(Op.NUM_KEYS, 0, [], self._timeout)
        return arg

    def append(self, key: str, value: Value) -> None:
        """Append ``value`` to the bytes at ``key`` (created empty); wakes waiters on it."""
        self._call(Op.APPEND, 0, [self._ck(key), self._cv(value)], self._timeout)

    def multi_get(self, keys: Iterable[str], *, timeout: Timeout = None) -> list[bytes]:
        """Return the values of all ``keys`` in order, waiting until all exist (one round trip)."""
        ks = [self._ck(k) for k in keys]
        if not ks:
            return []
        t = _seconds(timeout, self._timeout)
        _, blobs = self._call(Op.MULTI_GET, self._wait_ms(t), ks, t, wait_keys=ks)
        return blobs

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Set several keys in one round trip (applied atomically with respect to other clients)."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        if not keys:
            return
        blobs = [self._ck(k) for k in keys] + [self._cv(v) for v in values]
        self._call(Op.MULTI_SET, 0, blobs, self._timeout)

    def lease(self, key: str, value: Value, on_close: Value, *,
              keepalive_ms: int = 0) -> None:
        """Set ``key`` to ``value`` now, and the server sets it to ``on_close`` when this
        client's connection closes: when this process exits or dies (the kernel closes its
        sockets), or the connection is lost. The key says whether the holder is alive, as a
        ZooKeeper ephemeral node does. ``keepalive_ms`` > 0: the server probes the idle
        connection that often, so a holder behind a pulled cable is found gone in about
        four periods. A lost connection is not re-leased by a reconnect: the holder counts
        as gone from then on. Use a client of its own for it, that makes no other calls."""
        self._call(Op.LEASE, int(keepalive_ms),
                   [self._ck(key), self._cv(value), self._cv(on_close)], self._timeout)

    def ping(self) -> None:
        """One round trip to the server; raises if it is unreachable."""
        self._call(Op.PING, 0, [], self._timeout)

    def close(self) -> None:
        """Close the connection and, if this object hosts the server, stop the server."""
        with self._lock:
            self._closed = True
            self._drop()
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> TCPStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        role = "server+client" if self.server is not None else "client"
        return f"TCPStore({self.address}, {role})"
