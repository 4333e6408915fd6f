"""TCP transport: one connection per peer pair, works between hosts.

Frames are a 16-byte header (tag, payload length) followed by the payload. Sends go out with
``sendmsg([header, payload])`` straight from the user's memory; a receive reads the header and
then ``recv_into`` the posted buffer, so large messages are never copied in user space. All
sockets are non-blocking and progress is driven by the waiter, which reads and writes in the
same loop: both peers can send large messages to each other at once without deadlock.

Connection setup is deterministic: the higher rank connects to the lower one and proves
membership of the job with ``HMAC(token, listener nonce + rank)``; anything else that
connects to the data port is dropped without disturbing the job.
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import ipaddress
import os
import secrets
import select
import socket
import struct
import time
from collections import deque
from typing import Any

from ..errors import TransportError
from .base import (Capabilities, Channel, Request, Transport, peer_lost, size_mismatch,
                   take_posted)

HEADER = struct.Struct("<qq")            # tag, payload bytes
HELLO = struct.Struct("<8sI32s")         # magic, rank, proof
MAGIC = b"PYCOLLv1"


def _proof(token: str | None, nonce: str, rank: int) -> bytes:
    key = (token or "").encode()
    return hmac.new(key, f"{nonce}:{rank}".encode(), hashlib.sha256).digest()


def interface_address(ifname: str, family: int) -> str:
    """The first address of network interface ``ifname`` (``PYCOLL_SOCKET_IFNAME``)."""
    if family == socket.AF_INET6:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if fields[-1] == ifname:
                    raw = fields[0]
                    addr = ":".join(raw[i:i + 4] for i in range(0, 32, 4))
                    return str(ipaddress.IPv6Address(addr))
        raise TransportError(f"interface {ifname!r} has no IPv6 address (PYCOLL_SOCKET_IFNAME)")
    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        except OSError as e:
            raise TransportError(f"interface {ifname!r} has no IPv4 address "
                                 f"(PYCOLL_SOCKET_IFNAME): {e}") from None
    return socket.inet_ntoa(packed[20:24])


def choose_bind_address(master_addr: str | None) -> tuple[str, int]:
    """Pick (address, family) for the data port.

    ``PYCOLL_SOCKET_IFNAME`` names the interface; ``PYCOLL_SOCKET_FAMILY`` (ipv4/ipv6) the
    family. Otherwise use the local address the kernel would use to reach the master, which
    on a single host is loopback.
    """
    fam_name = os.environ.get("PYCOLL_SOCKET_FAMILY", "").lower()
    target = master_addr or "127.0.0.1"
    if fam_name in ("ipv6", "inet6", "6"):
        family = socket.AF_INET6
    elif fam_name in ("ipv4", "inet", "4"):
        family = socket.AF_INET
    else:
        family = socket.getaddrinfo(target, None)[0][0]
    ifname = os.environ.get("PYCOLL_SOCKET_IFNAME")
    if ifname:
        return interface_address(ifname, family), family
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target if family == socket.getaddrinfo(target, None)[0][0]
                       else ("::1" if family == socket.AF_INET6 else "127.0.0.1"), 9))
            return s.getsockname()[0], family
        except OSError:
            return ("::1" if family == socket.AF_INET6 else "127.0.0.1"), family


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    size = int(os.environ.get("PYCOLL_SOCKET_BUFFER", str(4 << 20)))
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
        except OSError:
            pass


class TcpChannel(Channel):
    """Messages to and from one peer over one TCP connection."""

    def __init__(self, transport: "TcpTransport", peer: int, sock: socket.socket) -> None:
        self.transport = transport
        self.peer = peer
        self._sock = sock
        sock.setblocking(False)
        self._fd = sock.fileno()
        self._sends: deque[Request] = deque()
        self._send_header: bytes | None = None   # header of the head send, until written
        self._send_offset = 0
        self._posted: deque[Request] = deque()
        self._unexpected: deque[tuple[int, bytes]] = deque()
        self._header = bytearray(HEADER.size)
        self._header_got = 0
        self._current: tuple[Any, int, memoryview] | None = None  # (request|bytearray, tag, view)
        self._current_got = 0
        self._broken: BaseException | None = None

    # -- sending -------------------------------------------------------------------------
    def isend(self, view: memoryview, tag: int = 0) -> Request:
        req = Request(self, view, tag, "send")
        if self._broken is not None:
            req.fail(self._broken)
            return req
        self._sends.append(req)
        if len(self._sends) == 1:
            self._send_header = HEADER.pack(tag, req.nbytes)
            self._send_offset = 0
            self._progress_send()
        return req

    def _progress_send(self) -> bool:
        moved = False
        sock = self._sock
        while self._sends:
            req = self._sends[0]
            try:
                if self._send_header is not None:
                    hdr = self._send_header
                    n = sock.sendmsg([hdr, req.view] if req.nbytes else [hdr])
                    if n < len(hdr):
                        self._send_header = hdr[n:]
                        return True
                    self._send_header = None
                    self._send_offset = n - len(hdr)
                else:
                    n = sock.send(req.view[self._send_offset:])
                    self._send_offset += n
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                self._break(peer_lost(self.peer, f"connection failed while sending: {e}"))
                return True
            moved = True
            req.bytes_done = self._send_offset
            if self._send_offset < req.nbytes:
                return moved
            self._sends.popleft()
            req.complete()
            if self._sends:
                self._send_header = HEADER.pack(self._sends[0].tag, self._sends[0].nbytes)
                self._send_offset = 0
        return moved

    # -- receiving -----------------------------------------------------------------------
    def irecv(self, view: memoryview, tag: int = 0) -> Request:
        req = Request(self, view, tag, "recv")
        if self._broken is not None:
            req.fail(self._broken)
            return req
        for i, (utag, body) in enumerate(self._unexpected):
            if utag == tag:
                del self._unexpected[i]
                if self._size_ok(req, len(body)):
                    view[:] = body
                    req.complete()
                return req
        self._posted.append(req)
        self._progress_recv()
        return req

    def _size_ok(self, req: Request, nbytes: int) -> bool:
        if nbytes == req.nbytes:
            return True
        self._break(size_mismatch(self.peer, req.tag, nbytes, req.nbytes))
        return False

    def _recv_into(self, view: memoryview) -> int:
        n = self._sock.recv_into(view)
        if n == 0:
            raise ConnectionResetError("connection closed by peer")
        return n

    def _progress_recv(self) -> bool:
        moved = False
        try:
            while self._posted or self._current is not None:
                if self._current is None:
                    n = self._recv_into(memoryview(self._header)[self._header_got:])
                    moved = True
                    self._header_got += n
                    if self._header_got < HEADER.size:
                        return moved
                    self._header_got = 0
                    tag, nbytes = HEADER.unpack(self._header)
                    req = take_posted(self._posted, tag)
                    if req is None:   # for another tag: set it aside
                        body = bytearray(nbytes)
                        self._current = (body, tag, memoryview(body))
                    else:
                        if not self._size_ok(req, nbytes):
                            return True
                        self._current = (req, tag, req.view)
                    self._current_got = 0
                target, tag, view = self._current
                if self._current_got < view.nbytes:
                    n = self._recv_into(view[self._current_got:])
                    moved = True
                    self._current_got += n
                    if isinstance(target, Request):
                        target.bytes_done = self._current_got
                    if self._current_got < view.nbytes:
                        return moved
                self._current = None
                if isinstance(target, Request):
                    target.complete()
                else:
                    # A receive for this tag may have been posted while the message was
                    # being set aside: it takes the message now, in order.
                    late = take_posted(self._posted, tag)
                    if late is None:
                        self._unexpected.append((tag, bytes(target)))
                    elif self._size_ok(late, len(target)):
                        late.view[:] = target
                        late.complete()
        except (BlockingIOError, InterruptedError):
            return moved
        except OSError as e:
            self._break(peer_lost(self.peer, f"connection failed while receiving: {e}"))
            return True
        return moved

    # -- progress, liveness, teardown ------------------------------------------------------
    def progress(self) -> bool:
        moved = False
        if self._sends:
            moved = self._progress_send()
        if self._posted or self._current is not None:
            moved = self._progress_recv() or moved
        return moved

    def poll_fd(self) -> tuple[int, int] | None:
        events = select.POLLIN if (self._posted or self._current is not None) else 0
        if self._sends:
            events |= select.POLLOUT
        return self._fd, events | select.POLLERR

    def check_alive(self) -> None:
        if self._broken is not None:
            raise self._broken

    def _break(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error
        for req in list(self._sends) + list(self._posted):
            req.fail(error)
        if self._current is not None and isinstance(self._current[0], Request):
            self._current[0].fail(error)
        self._sends.clear()
        self._posted.clear()
        self._current = None

    def close(self) -> None:
        self._break(TransportError(f"channel to peer rank {self.peer} was closed", peer=self.peer))
        try:
            self._sock.close()
        except OSError:
            pass


class TcpTransport(Transport):
    """TCP transport for peers anywhere on the network."""

    capabilities = Capabilities("tcp", latency_us=25.0, bandwidth_gbps=3.0, same_host_only=False,
                                segment_bytes=1 << 20)

    def __init__(self, rank: int, peers: list[int], *, token: str | None = None,
                 master_addr: str | None = None) -> None:
        self.rank = rank
        self.peers = list(peers)
        self._token = token
        self._nonce = secrets.token_hex(16)
        host, family = choose_bind_address(master_addr)
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(max(16, len(self.peers)))
        self._channels: dict[int, TcpChannel] = {}
        self.host = host

    def address(self) -> dict[str, Any]:
        return {"host": self.host, "port": self._listener.getsockname()[1], "nonce": self._nonce}

    def connect(self, addresses: dict[int, dict[str, Any]], deadline: float) -> dict[int, Channel]:
        try:
            for peer in sorted(p for p in self.peers if p < self.rank):
                sock = self._dial(peer, addresses[peer], deadline)
                self._channels[peer] = TcpChannel(self, peer, sock)
            expected = {p for p in self.peers if p > self.rank}
            for peer, sock in self._accept(expected, deadline).items():
                self._channels[peer] = TcpChannel(self, peer, sock)
        finally:
            self._listener.close()
        return dict(self._channels)

    def _dial(self, peer: int, addr: dict[str, Any], deadline: float) -> socket.socket:
        delay = 0.01
        sock: socket.socket | None = None
        while True:
            try:
                sock = socket.create_connection(
                    (addr["host"], addr["port"]), timeout=max(0.1, deadline - time.monotonic()))
                _tune(sock)
                sock.sendall(HELLO.pack(MAGIC, self.rank, _proof(self._token, addr["nonce"], self.rank)))
                if sock.recv(1) != b"\x01":
                    sock.close()
                    raise TransportError(
                        f"tcp: peer rank {peer} at {addr['host']}:{addr['port']} refused this rank's "
                        "handshake: are both ranks in the same job (same PYCOLL_TOKEN)?", peer=peer)
                sock.settimeout(None)
                return sock
            except (ConnectionRefusedError, socket.timeout, OSError) as e:
                if isinstance(e, TransportError):
                    raise
                if sock is not None:
                    sock.close()
                    sock = None
                if time.monotonic() + delay > deadline:
                    raise TransportError(
                        f"tcp: could not connect to peer rank {peer} at {addr['host']}:{addr['port']}"
                        f" before the deadline: {e}; check that the address is reachable from this "
                        "host (PYCOLL_SOCKET_IFNAME selects the interface)", peer=peer) from None
                time.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
                delay = min(delay * 2, 1.0)

    def _accept(self, expected: set[int], deadline: float) -> dict[int, socket.socket]:
        accepted: dict[int, socket.socket] = {}
        partial: dict[socket.socket, bytearray] = {}
        self._listener.setblocking(False)
        while len(accepted) < len(expected):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for s in list(partial) + list(accepted.values()):
                    s.close()
                missing = sorted(expected - set(accepted))
                raise TransportError(f"tcp: peer rank(s) {missing} did not connect before the "
                                     "deadline", peer=missing[0])
            readable, _, _ = select.select([self._listener, *partial], [], [], min(remaining, 0.5))
            for s in readable:
                if s is self._listener:
                    try:
                        conn, _ = self._listener.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(False)
                    partial[conn] = bytearray()
                    continue
                buf = partial[s]
                try:
                    chunk = s.recv(HELLO.size - len(buf))
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    del partial[s]
                    s.close()
                    continue
                buf += chunk
                if len(buf) < HELLO.size:
                    continue
                del partial[s]
                magic, rank, proof = HELLO.unpack(bytes(buf))
                if (magic != MAGIC or rank not in expected or rank in accepted
                        or not hmac.compare_digest(proof, _proof(self._token, self._nonce, rank))):
                    s.close()   # a stranger, or a peer of another job: drop it quietly
                    continue
                s.setblocking(True)
                _tune(s)
                s.sendall(b"\x01")
                accepted[rank] = s
        for s in partial:
            s.close()
        return accepted

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        try:
            self._listener.close()
        except OSError:
            pass
