"""Wire-up: the job-membership handshake and lazy dials that open a pair's sockets.

The higher rank of a pair dials (``Dial``, non-blocking: connect, send ``HELLO`` with
``HMAC(token, listener nonce : rank)``, await a one-byte ack); the lower rank's ``Acceptor``
accepts and checks it. Kept apart from ``tcp/`` so that the tcp transport reads like the
others (a channel and a transport), and because it is not tcp's alone: the verbs transport
sets up its queue pairs over the same dial and handshake (its socket then carries no data:
only the queue-pair addresses, and a farewell).

With TLS (``Connector(tls=...)``, tcp when ``PYCOLL_TLS_*`` are set) every socket runs a
non-blocking TLS 1.3 handshake, both sides presenting the job's certificates, right after the
TCP connect, within the same deadlines; the ``HELLO`` and its HMAC proof then travel inside
the TLS stream, unchanged.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rendezvous.tls import TlsFiles, describe_tls_failure

from ..errors import TransportError
from .base import peer_lost
from .netif import MAX_STREAMS, tune

if TYPE_CHECKING:
    from .base import Channel


class Dialer(Protocol):
    """What a ``Dial`` needs of its transport."""

    name: str
    rank: int
    token: str | None

HELLO = struct.Struct("<8sIHH32s")       # magic, rank, stream, streams, proof
MAGIC = b"PYCOLLv2"


def proof(token: str | None, nonce: str, rank: int, stream: int, streams: int) -> bytes:
    key = (token or "").encode()
    return hmac.new(key, f"{nonce}:{rank}:{stream}/{streams}".encode(), hashlib.sha256).digest()


#: how long an accepted connection may take to prove it belongs to the job
HANDSHAKE_SECONDS = 10.0
#: connections still handshaking at once; beyond it the oldest is dropped (floods)
MAX_HANDSHAKES = 256
#: a non-blocking socket has nothing for us now (the ssl ones: a TLS socket's)
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class Dial:
    """A non-blocking connection attempt to a lower rank: connect, (TLS handshake,) prove,
    await the ack. One per socket of the pair (``stream`` of ``streams``)."""

    def __init__(self, transport: Dialer, channel: Channel, addr: dict[str, Any],
                 deadline: float, stream: int = 0, streams: int = 1,
                 tls: ssl.SSLContext | None = None) -> None:
        self.transport = transport
        self.channel = channel
        self.stream = stream
        self.addr = addr
        self.deadline = deadline
        self.tls = tls
        self.sock: socket.socket | None = None
        self.state = "idle"            # idle -> connecting -> (tls ->) ack
        self.wants = select.EPOLLIN    # what the TLS handshake waits for
        self.retry_at = 0.0
        self.delay = 0.01
        self.hello = HELLO.pack(MAGIC, transport.rank, stream, streams,
                                proof(transport.token, str(addr["nonce"]), transport.rank,
                                      stream, streams))

    def _fail(self, why: str) -> None:
        peer = self.channel.peer
        self.channel.break_with(TransportError(
            f"{self.transport.name}: could not connect to peer rank {peer} at {self.addr['host']}:"
            f"{self.addr['port']}: {why}; check that the address is reachable from this host "
            "(PYCOLL_SOCKET_IFNAME selects the interface)", peer=peer))

    def _retry(self, why: str) -> bool:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        now = time.monotonic()
        if now + self.delay > self.deadline:
            self._fail(f"{why} (until the deadline)")
            return True
        self.retry_at = now + self.delay * (0.5 + secrets.randbelow(1000) / 1000)
        self.delay = min(self.delay * 2, 1.0)
        self.state = "idle"
        return False

    def _tls_failed(self, error: BaseException) -> bool:
        if self.sock is not None:
            self.sock.close()
        peer = self.channel.peer
        self.channel.break_with(TransportError(
            f"{self.transport.name}: rank {self.transport.rank} could not connect to peer rank "
            f"{peer} at {self.addr['host']}:{self.addr['port']}: "
            f"{describe_tls_failure(error)}", peer=peer))
        return True

    def events(self) -> int:
        if self.state == "tls":
            return self.wants
        return select.EPOLLOUT if self.state == "connecting" else select.EPOLLIN

    def _handshake_tls(self, sock: socket.socket) -> bool | None:
        """One step of the TLS handshake: None when done, else ``progress``'s answer."""
        try:
            sock.do_handshake()    # type: ignore[attr-defined]
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as e:
            self.wants = (select.EPOLLIN if isinstance(e, ssl.SSLWantReadError)
                          else select.EPOLLOUT)
            if time.monotonic() > self.deadline:
                self._fail("the TLS handshake did not finish before the deadline")
                sock.close()
                return True
            return False
        except ssl.SSLError as e:
            return self._tls_failed(e)
        except OSError as e:
            return self._retry(str(e))
        return None

    def progress(self) -> bool:
        """Advance; True once finished (connected or failed)."""
        if self.channel.broken is not None:
            if self.sock is not None:
                self.sock.close()
            return True
        if self.state == "idle":
            if time.monotonic() < self.retry_at:
                return False
            try:
                info = socket.getaddrinfo(self.addr["host"], self.addr["port"],
                                          type=socket.SOCK_STREAM)[0]
                self.sock = socket.socket(info[0], socket.SOCK_STREAM)
                self.sock.setblocking(False)
                tune(self.sock)
                err = self.sock.connect_ex(info[4])
            except OSError as e:
                return self._retry(str(e))
            if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
                return self._retry(os.strerror(err))
            self.state = "connecting"
        sock = self.sock
        assert sock is not None
        if self.state == "connecting":
            p = select.poll()
            p.register(sock.fileno(), select.POLLOUT)
            if not p.poll(0):
                if time.monotonic() > self.deadline:
                    self._fail("no answer before the deadline")
                    sock.close()
                    return True
                return False
            err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err == errno.ECONNREFUSED:
                # The listener existed before its address was published: refused means the
                # process is gone or has closed its communicator, not "not yet".
                sock.close()
                self.channel.break_with(peer_lost(
                    self.channel.peer, f"its data port {self.addr['host']}:{self.addr['port']} "
                    "refused the connection (the process exited or closed its communicator)"))
                return True
            if err:
                return self._retry(os.strerror(err))
            if self.tls is not None:
                sock = self.sock = self.tls.wrap_socket(sock, do_handshake_on_connect=False)
                self.state = "tls"
        if self.state == "tls":
            step = self._handshake_tls(sock)
            if step is not None:
                return step
        if self.state in ("connecting", "tls"):
            try:
                sock.sendall(self.hello)     # 48 bytes into an empty socket buffer
            except OSError as e:
                return self._retry(str(e))
            self.state = "ack"
        try:
            answer = sock.recv(1)
        except WOULD_BLOCK:
            if time.monotonic() > self.deadline:
                self._fail("the peer accepted the connection but never answered the handshake")
                sock.close()
                return True
            return False
        except ssl.SSLError as e:    # TLS 1.3: the peer checks our certificate only now
            return self._tls_failed(e)
        except OSError as e:
            return self._retry(str(e))
        if answer == b"" and time.monotonic() < self.deadline:
            return self._retry("the peer closed the connection during the handshake")
        if answer != b"\x01":
            sock.close()
            peer = self.channel.peer
            self.channel.break_with(TransportError(
                f"{self.transport.name}: peer rank {peer} at {self.addr['host']}:"
                f"{self.addr['port']} refused this "
                "rank's handshake: are both ranks in the same job (same PYCOLL_TOKEN)?",
                peer=peer))
            return True
        self.channel.attach(sock, self.stream)  # type: ignore[attr-defined]
        return True


class Handshake:
    """An accepted connection that has not yet proved which rank of the job it is (nor,
    with TLS, finished its TLS handshake: ``secured``)."""

    __slots__ = ("sock", "buf", "since", "secured")

    def __init__(self, sock: socket.socket, secured: bool) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.since = time.monotonic()
        self.secured = secured


class Connector:
    """Lazy per-pair sockets, shared by tcp (its data connections) and verbs (setup and
    liveness): the channel table, the dials of the higher rank of each pair, the lower
    rank's ``Acceptor``, and whether a channel with work still waits for its peer to dial in.

    A pair has ``streams`` sockets: the smaller of the two ranks' counts, which each side
    computes from the other's published address (the dialer also states it in its
    ``HELLO``). A channel is made by ``make_channel(peer, streams)`` and must offer
    ``attach(sock, stream)``, ``busy()``, ``ready``, ``streams`` and ``broken``. With
    ``tls`` every socket is a TLS one (``ssl.SSLSocket``), in both directions.
    """

    def __init__(self, transport: Dialer, size: int, accepts: Callable[[str, int], bool],
                 host: str, family: int, make_channel: Callable[[int, int], Any],
                 streams: int = 1, tls: TlsFiles | None = None) -> None:
        self.transport = transport
        self.host = host
        self.streams = streams
        self._tls = tls.client_context() if tls is not None else None
        self._accepts = accepts
        self._make = make_channel
        self.channels: dict[int, Any] = {}
        self.attached: dict[int, set[int]] = {}      # peer -> its sockets accepted so far
        self.dials: dict[tuple[int, int], Dial] = {}
        self.awaiting = False       # a channel with work waits for its peer to dial in
        self.acceptor = Acceptor(transport.rank, size, transport.token, host, family,
                                 self._may_admit, self._attach,
                                 tls.server_context() if tls is not None else None)

    def address(self) -> dict[str, Any]:
        return dict(self.acceptor.address(self.host), streams=self.streams)

    def connect(self, peer: int, address: dict[str, Any], deadline: float) -> Any:
        """The channel to ``peer``, created on first use: the higher rank dials."""
        ch = self.channels.get(peer)
        if ch is None:
            streams = max(1, min(self.streams, int(address.get("streams", 1))))
            ch = self.channels[peer] = self._make(peer, streams)
            if peer < self.transport.rank:
                for stream in range(streams):
                    self.dials[(peer, stream)] = Dial(self.transport, ch, address, deadline,
                                                      stream, streams, self._tls)
            else:
                self.awaiting = True
        return ch

    def _may_admit(self, rank: int, stream: int, streams: int) -> bool:
        existing = self.channels.get(rank)
        if existing is None:
            fits = streams <= self.streams
        else:
            fits = streams == existing.streams and stream not in self.attached.get(rank, ())
        return fits and self._accepts(self.transport.name, rank)

    def _attach(self, rank: int, stream: int, streams: int, sock: socket.socket) -> None:
        ch = self.channels.get(rank)
        if ch is None:
            ch = self.channels[rank] = self._make(rank, streams)
        self.attached.setdefault(rank, set()).add(stream)
        ch.attach(sock, stream)

    def progress(self, active: Any) -> bool:
        """Advance dials and the acceptor; ``active``: the channels with work."""
        moved = False
        if self.dials:
            for key, dial in list(self.dials.items()):
                if dial.progress():
                    del self.dials[key]
                    moved = True
        moved = self.acceptor.progress() or moved
        rank, attached = self.transport.rank, self.attached
        self.awaiting = any(ch.peer > rank and ch.busy() and ch.broken is None
                            and len(attached.get(ch.peer, ())) < ch.streams for ch in active)
        return moved

    @property
    def pending(self) -> bool:
        """Connection setup in progress (the engine must progress even idle channels)."""
        return bool(self.dials or self.acceptor.proven or self.awaiting)

    def fds(self) -> list[tuple[int, int]]:
        return self.acceptor.fds() + [(d.sock.fileno(), d.events()) for d in self.dials.values()
                                      if d.sock is not None]

    def connections(self) -> int:
        return sum(ch.ready for ch in self.channels.values())

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()
        for dial in self.dials.values():
            if dial.sock is not None:
                dial.sock.close()
        self.dials.clear()
        self.acceptor.close()


class ConnectorTransport:
    """The transport methods that only hand over to a ``Connector`` (``self._setup``), for
    tcp and verbs alike: their published address, lazy channels, the open-connection count."""

    _setup: Connector
    setup_pending: bool

    def address(self) -> dict[str, Any]:
        return self._setup.address()

    def connect(self, peer: int, address: dict[str, Any], deadline: float) -> Any:
        ch = self._setup.connect(peer, address, deadline)
        self.setup_pending = self._setup.pending
        return ch

    def connections(self) -> int:
        """Open connections (for tests and diagnostics)."""
        return self._setup.connections()


class Acceptor:
    """The listening side of connection setup, shared by tcp and verbs (``Connector``).

    The listener and the connections that have not proved themselves yet belong to a thread
    of their own (``_gatekeeper``), not to the progress engine: a rank busy in user code or
    in a long collective does not progress, and strangers would otherwise wait in the
    kernel's backlog as long as it is busy, filling it, so that a peer's lazy dial waits for
    the kernel's SYN retry. The gatekeeper accepts at once, gives every connection
    ``HANDSHAKE_SECONDS`` from its arrival to prove it is rank ``r`` of this job (``HELLO``),
    whatever the rank is doing, and checks the proof. Anything else (a stranger, a flood of
    silent sockets, a peer of another job) is dropped without disturbing the job; beyond
    ``MAX_HANDSHAKES``, or when descriptors run short, the oldest unproven connection goes
    first. With ``tls`` the TLS handshake comes first, under the same deadline; a peer whose
    certificate this side refuses is dropped like a stranger (the dialer, whose handshake
    fails too, reports it).

    Proven sockets wait in ``proven`` (a byte on a pipe wakes the engine) for ``progress``,
    on the call path, to ask ``may_admit(r, stream, streams)`` (is ``r`` a higher rank that
    may dial this socket of the pair now), ack them, and ``attach(r, stream, streams,
    sock)``: the channels stay the engine's alone.
    """

    def __init__(self, rank: int, size: int, token: str | None, host: str, family: int,
                 may_admit: Callable[[int, int, int], bool],
                 attach: Callable[[int, int, int, socket.socket], None],
                 tls: ssl.SSLContext | None = None) -> None:
        self.rank = rank
        self.size = size
        self.token = token
        self.tls = tls
        self.nonce = secrets.token_hex(16)
        self._may_admit = may_admit
        self._attach = attach
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.handshakes: dict[int, Handshake] = {}     # the gatekeeper's, oldest first
        #: proven by the gatekeeper, for ``progress``: (rank, stream, streams, socket)
        self.proven: deque[tuple[int, int, int, socket.socket]] = deque()
        self._wake_r, self._wake_w = os.pipe()          # gatekeeper -> engine
        self._stop_r, self._stop_w = os.pipe()          # close -> gatekeeper
        for fd in (self._wake_r, self._wake_w, self._stop_w):
            os.set_blocking(fd, False)
        self._closed = False
        self._gate = threading.Thread(target=self._gatekeeper, daemon=True,
                                      name=f"pycoll-accept-rank{rank}")
        self._gate.start()

    def address(self, host: str) -> dict[str, Any]:
        return {"host": host, "port": self.listener.getsockname()[1], "nonce": self.nonce}

    # -- the engine's side -------------------------------------------------------------
    def progress(self) -> bool:
        """Admit the connections the gatekeeper has proven; True if any came."""
        if not self.proven:
            return False
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass
        while self.proven:
            rank, stream, streams, sock = self.proven.popleft()
            try:
                if not self._may_admit(rank, stream, streams):
                    sock.close()        # not now (a stream it has, a transport it may not use)
                    continue
                sock.send(b"\x01")
                tune(sock)
            except Exception:   # noqa: BLE001 - a bad handshake must never fail the job
                sock.close()
                continue
            self._attach(rank, stream, streams, sock)
        return True

    def fds(self) -> list[tuple[int, int]]:
        return [(self._wake_r, select.EPOLLIN)]

    # -- the gatekeeper thread ---------------------------------------------------------
    def _gatekeeper(self) -> None:
        """Accept, drop what is past its deadline, read HELLOs, until ``close``."""
        listener = self.listener.fileno()
        while True:
            try:
                now = time.monotonic()
                while self.handshakes:          # oldest first: drop the expired ones
                    fd, hs = next(iter(self.handshakes.items()))
                    if now - hs.since <= HANDSHAKE_SECONDS:
                        break
                    del self.handshakes[fd]     # silent: a stranger, or a dead dialer
                    hs.sock.close()
                poller = select.poll()
                poller.register(self._stop_r, select.POLLIN)
                poller.register(listener, select.POLLIN)
                for fd in self.handshakes:
                    poller.register(fd, select.POLLIN)
                timeout = None
                if self.handshakes:
                    oldest = next(iter(self.handshakes.values()))
                    timeout = max(0.0, oldest.since + HANDSHAKE_SECONDS - now) * 1000 + 1
                for fd, _ in poller.poll(timeout):
                    if fd == self._stop_r:
                        return
                    if fd == listener:
                        self._accept()
                    elif fd in self.handshakes:
                        self._advance(fd)
            except Exception:   # noqa: BLE001 - the gatekeeper must outlive any stranger
                time.sleep(0.01)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:   # EMFILE and friends: keep the job running
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    if not self.handshakes:
                        time.sleep(0.05)    # nothing of ours to free: do not spin on it
                    self._drop_oldest_handshake()
                return
            conn.setblocking(False)
            if len(self.handshakes) >= MAX_HANDSHAKES:
                self._drop_oldest_handshake()
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True,
                                                do_handshake_on_connect=False)
                except OSError:     # gone already
                    conn.close()
                    continue
            self.handshakes[conn.fileno()] = Handshake(conn, secured=self.tls is None)

    def _drop_oldest_handshake(self) -> None:
        if self.handshakes:
            fd = next(iter(self.handshakes))
            self.handshakes.pop(fd).sock.close()

    def _advance(self, fd: int) -> None:
        """One step of connection ``fd``'s handshake: TLS, then reading its HELLO."""
        hs = self.handshakes[fd]
        try:
            if not hs.secured:
                hs.sock.do_handshake()     # type: ignore[attr-defined]
                hs.secured = True
            chunk = hs.sock.recv(HELLO.size - len(hs.buf))
        except WOULD_BLOCK:
            return
        except OSError:   # ssl.SSLError too: a plain stranger, a certificate we refuse
            chunk = b""
        if chunk:
            hs.buf += chunk
            if len(hs.buf) < HELLO.size:
                return
        del self.handshakes[fd]
        claim = self._proves(hs) if chunk else None
        if claim is None:
            hs.sock.close()   # gone, a stranger, or a peer of another job: drop it quietly
            return
        self.proven.append((*claim, hs.sock))
        try:
            os.write(self._wake_w, b"\x01")
        except OSError:
            pass              # the pipe is full: the engine is woken already

    def _proves(self, hs: Handshake) -> tuple[int, int, int] | None:
        """The (rank, stream, streams) a complete HELLO proves, or None. The proof comes
        first: nothing a stranger sends reaches any other code."""
        magic, rank, stream, streams, claimed = HELLO.unpack(bytes(hs.buf))
        if (magic != MAGIC or not self.rank < rank < self.size
                or not 0 <= stream < streams <= MAX_STREAMS
                or not hmac.compare_digest(claimed, proof(self.token, self.nonce, rank,
                                                          stream, streams))):
            return None
        return rank, stream, streams

    def close(self) -> None:
        if self._closed:
            return              # its descriptor numbers may be another's by now
        self._closed = True
        try:
            os.write(self._stop_w, b"\x01")
        except OSError:
            pass
        if self._gate is not threading.current_thread():
            self._gate.join(timeout=5.0)
        for hs in self.handshakes.values():
            hs.sock.close()
        self.handshakes.clear()
        while self.proven:
            self.proven.popleft()[3].close()
        try:
            self.listener.close()
        except OSError:
            pass
        for fd in (self._wake_r, self._wake_w, self._stop_r, self._stop_w):
            try:
                os.close(fd)
            except OSError:
                pass
