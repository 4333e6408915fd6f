"""A test hook, off in production: flip one bit in a message a transport has received.

It exists to show that the integrity checks (``integrity=True``, docs/integrity.md) catch
what they claim: a bit that changes between the sender's memory and the receiver's, as a
faulty NIC, DIMM or transport would change it. ``PYCOLL_TEST_FLIP`` is read once, when the
first transport is made (``registry.transport_class``); unset, nothing here is ever called
and every channel makes its receives of the plain ``matching.Request``. Set, receives are
made of ``FlipRequest``, whose ``complete`` (called by every transport once the bytes of a
receive have landed in the user's buffer: shm slot copy or cross-memory attach, tcp
``recv_into``, verbs RDMA write, inproc copy) asks the process's ``BitFlipper`` whether to
flip a bit first.

``PYCOLL_TEST_FLIP=1`` installs the hook disarmed: a test arms it in the rank process
(``flipper().arm(...)``: one flip, in the ``nth`` message from ``peer``). A spec arms it from
the environment, for programs the test cannot reach: ``peer=0,nth=1,itemsize=4,bits=20-31,
seed=7`` (each key optional).
"""
from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..envvars import env_text
from ..errors import InvalidArgument
from .matching import Request


@dataclass
class Flip:
    """One bit flipped: in a message of ``nbytes`` from ``peer``, element ``element``
    (of ``itemsize`` bytes), bit ``bit`` of that element (0: least significant)."""

    peer: int
    nbytes: int
    element: int
    itemsize: int
    bit: int


@dataclass
class _Plan:
    peer: int | None
    nth: int
    itemsize: int
    bits: Sequence[int]
    rng: random.Random
    seen: int = 0


@dataclass
class BitFlipper:
    """What to flip next (one flip per ``arm``) and what was flipped (``fired``)."""

    plan: _Plan | None = None
    fired: list[Flip] = field(default_factory=list)

    def arm(self, peer: int | None = None, nth: int = 1, itemsize: int = 1,
            bits: Sequence[int] = range(8), seed: int | None = None) -> None:
        """Flip one bit in the ``nth`` message received from ``peer`` (any peer: None) from
        now on: in a random element (of ``itemsize`` bytes), one of ``bits`` of it."""
        self.plan = _Plan(peer, nth, itemsize, list(bits), random.Random(seed))

    def disarm(self) -> None:
        self.plan = None

    def on_receive(self, peer: int, view: memoryview) -> None:
        plan = self.plan
        if plan is None or (plan.peer is not None and plan.peer != peer):
            return
        if len(view) < plan.itemsize:
            return
        plan.seen += 1
        if plan.seen < plan.nth:
            return
        self.plan = None
        element = plan.rng.randrange(len(view) // plan.itemsize)
        bit = plan.rng.choice(plan.bits)
        byte = element * plan.itemsize + bit // 8      # little-endian elements
        view[byte] ^= 1 << (bit % 8)
        self.fired.append(Flip(peer, len(view), element, plan.itemsize, bit))


class FlipRequest(Request):
    """A receive that lets the process's ``BitFlipper`` at its bytes before it completes."""

    __slots__ = ()

    def complete(self) -> None:
        hook = _FLIPPER
        if hook is not None and self.kind == "recv" and self.view is not None:
            hook.on_receive(self.channel.peer, self.view)
        Request.complete(self)


_FLIPPER: BitFlipper | None = None
#: the process that read ``PYCOLL_TEST_FLIP`` (a rank forked from a process that read it
#: without the variable, e.g. a test runner, reads its own environment again)
_READ_BY: int | None = None


def flipper() -> BitFlipper | None:
    """The process's flipper (None: ``PYCOLL_TEST_FLIP`` is unset, the hook is off)."""
    return _FLIPPER


def receive_request() -> type[Request]:
    """What channels make receives of, after reading ``PYCOLL_TEST_FLIP`` once."""
    global _FLIPPER, _READ_BY
    if _READ_BY != os.getpid():
        _READ_BY = os.getpid()
        _FLIPPER = None
        raw = env_text("PYCOLL_TEST_FLIP")
        if raw is not None and raw.lower() not in ("0", "off", "false", "no"):
            _FLIPPER = BitFlipper()
            if "=" in raw:
                _FLIPPER.arm(**_parse(raw))
    return Request if _FLIPPER is None else FlipRequest


def _parse(raw: str) -> dict:
    spec: dict = {}
    try:
        for item in raw.split(","):
            key, _, value = item.partition("=")
            key = key.strip()
            if key == "bits":
                lo, _, hi = value.partition("-")
                spec["bits"] = range(int(lo), int(hi or lo) + 1)
            elif key in ("peer", "nth", "itemsize", "seed"):
                spec[key] = int(value)
            else:
                raise ValueError(key)
    except ValueError:
        raise InvalidArgument(f"PYCOLL_TEST_FLIP={raw!r}: a test hook; use 1, or keys peer=, "
                              "nth=, itemsize=, bits=LO-HI, seed= (docs/integrity.md)") from None
    return spec

