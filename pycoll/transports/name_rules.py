"""NCCL's syntax for choosing devices by name, shared by ``PYCOLL_SOCKET_IFNAME`` (network
interfaces) and ``PYCOLL_IB_HCA`` (RDMA devices and ports).

A comma-separated list of name prefixes (``eth,ens``: any name starting so); a leading ``=``
makes every name exact (``=eth0`` is not ``eth01``); a leading ``^`` turns the list into
exclusions (``^lo,docker``: anything but loopback and docker bridges); both together read
``^=``. Where ports exist (RDMA devices) an item may name one: ``mlx5_0:1``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument


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
