"""Network interfaces and device names: which address a rank listens on, and how a socket is
tuned. Shared by the transports that open sockets (tcp's data sockets, the setup socket of
verbs) and by the launcher's MPI bootstrap.

NCCL's syntax for choosing devices by name is shared by ``PYCOLL_SOCKET_IFNAME`` (network
interfaces) and ``PYCOLL_IB_HCA`` (RDMA devices and ports): a comma-separated list of name
prefixes (``eth,ens``: any name starting so); a leading ``=`` makes every name exact (``=eth0``
is not ``eth01``); a leading ``^`` turns the list into exclusions (``^lo,docker``: anything but
loopback and docker bridges); both together read ``^=``. Where ports exist (RDMA devices) an
item may name one: ``mlx5_0:1``.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from ..envvars import env_choice, env_int
from ..errors import InvalidArgument, TransportError

#: sockets per peer pair at most (``PYCOLL_SOCKET_NSOCKS``)
MAX_STREAMS = 16


@dataclass(frozen=True)
class NameRule:
    name: str
    port: int | None
    exact: bool

    def matches(self, name: str, port: int | None = None) -> bool:
        named = name == self.name if self.exact else name.startswith(self.name)
        return named and (self.port is None or self.port == port)


@dataclass(frozen=True)
class NameRules:
    """A parsed list: ``admits(name[, port])`` says whether a device may be used."""

    exclude: bool
    rules: tuple[NameRule, ...]

    def admits(self, name: str, port: int | None = None) -> bool:
        listed = any(r.matches(name, port) for r in self.rules)
        return listed != self.exclude if self.rules else True


def parse_name_rules(variable: str, spec: str, *, ports: bool = False) -> NameRules:
    """Parse ``spec`` (the value of ``variable``, named in errors); blank admits anything."""
    text = spec.strip()
    if not text:
        return NameRules(False, ())
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    rules = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, colon, port = item.partition(":") if ports else (item, "", "")
        try:
            rules.append(NameRule(name, int(port) if colon else None, exact))
        except ValueError:
            raise InvalidArgument(f"{variable}={spec!r}: bad port in {item!r} "
                                  "(expected name[:port], comma separated)") from None
    if not rules:
        raise InvalidArgument(f"{variable}={spec!r} names nothing (expected a comma-separated "
                              "list of names or prefixes, '^' to exclude, '=' for exact names)")
    return NameRules(exclude, tuple(rules))


def socket_streams() -> int:
    """Sockets per peer pair (``PYCOLL_SOCKET_NSOCKS``, NCCL's ``NCCL_SOCKET_NTHREADS`` x
    ``NCCL_NSOCKS_PERTHREAD``): large messages are striped over them, so one slow flow (a
    congestion window, a flow-hashed bond or ECMP path) does not cap a pair's bandwidth."""
    n = env_int("PYCOLL_SOCKET_NSOCKS", 1, minimum=1)
    if n > MAX_STREAMS:
        raise InvalidArgument(f"PYCOLL_SOCKET_NSOCKS={n}: at most {MAX_STREAMS} sockets per peer")
    return n


def interface_address(ifname: str, family: int) -> str | None:
    """The address of network interface ``ifname`` in ``family``, or None. IPv6: a global
    (or, on loopback, the host) address, never a link-local one, which would need a scope."""
    if family == socket.AF_INET6:
        found: dict[str, str] = {}
        try:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    raw, _index, _plen, scope, _flags, name = line.split()
                    if name == ifname:
                        found.setdefault(scope, str(ipaddress.IPv6Address(int(raw, 16))))
        except OSError:
            return None
        return found.get("00") or found.get("10")      # global, else host (::1)
    SIOCGIFADDR = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def select_interface(spec: str, family: int) -> tuple[str, str]:
    """(interface, address) for ``PYCOLL_SOCKET_IFNAME=spec`` (NCCL's syntax: ``eth``,
    ``=eth0``, ``^lo,docker``; see ``parse_name_rules``): the first interface, in the kernel's
    order, that the rules admit and that has an address of ``family``."""
    rules = parse_name_rules("PYCOLL_SOCKET_IFNAME", spec)
    fam = "IPv6" if family == socket.AF_INET6 else "IPv4"
    seen = []
    for _, name in socket.if_nameindex():
        if not rules.admits(name):
            continue
        addr = interface_address(name, family)
        if addr is not None:
            return name, addr
        seen.append(f"{name} has no {fam} address")
    names = ", ".join(n for _, n in socket.if_nameindex())
    why = "; ".join(seen) or f"it admits none of this host's interfaces ({names})"
    raise TransportError(f"PYCOLL_SOCKET_IFNAME={spec!r}: no usable interface: {why}")


def choose_bind_address(master_addr: str | None) -> tuple[str, int]:
    """Pick (address, family) for the data port.

    ``PYCOLL_SOCKET_IFNAME`` selects the interface (``select_interface``);
    ``PYCOLL_SOCKET_FAMILY`` (ipv4/ipv6) the family, which otherwise is the master address's.
    Without an interface, use the local address the kernel would use to reach the master,
    which on a single host is loopback.
    """
    fam_name = env_choice("PYCOLL_SOCKET_FAMILY", "", ("ipv4", "ipv6", "inet", "inet6", "4", "6"))
    target = master_addr or "127.0.0.1"
    if fam_name in ("ipv6", "inet6", "6"):
        family = socket.AF_INET6
    elif fam_name in ("ipv4", "inet", "4"):
        family = socket.AF_INET
    else:
        family = socket.getaddrinfo(target, None)[0][0]
    ifname = os.environ.get("PYCOLL_SOCKET_IFNAME", "").strip()
    if ifname:
        return select_interface(ifname, family)[1], family
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((target if family == socket.getaddrinfo(target, None)[0][0]
                       else ("::1" if family == socket.AF_INET6 else "127.0.0.1"), 9))
            return s.getsockname()[0], family
        except OSError:
            return ("::1" if family == socket.AF_INET6 else "127.0.0.1"), family


def tune(sock: socket.socket) -> None:
    """Low latency, big buffers, and a dead link noticed in seconds, not in the kernel's
    ~15 minutes of retransmissions: unacknowledged data fails the socket after
    ``PYCOLL_SOCKET_DEAD_MS`` (TCP_USER_TIMEOUT), and an idle one is probed (keepalive) so
    a peer behind a pulled cable is found while this rank only waits to receive."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    size = env_int("PYCOLL_SOCKET_BUFFER", 4 << 20, minimum=4096)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)
        except OSError:
            pass
    dead_ms = env_int("PYCOLL_SOCKET_DEAD_MS", 10_000, minimum=1000)
    probe = max(1, dead_ms // 5000)                 # seconds between keepalive probes
    options: list[tuple[int, int | None, int]] = [
            (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), probe),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), probe),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 4),
            (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), dead_ms)]
    for level, name, value in options:
        if name is None:
            continue
        try:
            sock.setsockopt(level, name, value)
        except OSError:
            pass
