"""The verbs transport's wire: its message header and kinds, the queue-pair addresses the
setup socket carries, the farewell, how a work request's id names what it was for, and the
messages and RDMA writes waiting to be posted.

Both ranks of a pair read and write these layouts, so they change together or not at all.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from ...errors import TransportError
from ..matching import Request

#: a message between channels: kind, aux (rkey / notify), tag, nbytes, ident, address
HDR = struct.Struct("<IIqqqQ")
#: message kinds: eager bytes, ready-to-send, clear-to-send, a put's notice
EAGER, RTS, CTS, PUT = 1, 2, 3, 4

#: queue pairs per peer at most (one control queue pair and up to 7 data queue pairs)
MAX_QPS = 8
#: queue-pair addresses exchanged over the setup socket (``QpAddresses``)
INFO = struct.Struct(f"<8s40sHIIBIIQI{MAX_QPS}I")
INFO_MAGIC = b"PCVERBS1"
#: the only thing the setup socket carries after the exchange: "I leave because rank N died"
FAREWELL = struct.Struct("<8sq")
FAREWELL_MAGIC = b"PCLEAVE1"

# work request ids: kind << 48 | queue pair << 40 | index
WR_SLOT, WR_INLINE, WR_CREDIT, WR_RNDV, WR_PUT, WR_RING, WR_DATA, WR_PUTDATA, WR_WINDOW = \
    range(1, 10)
INDEX_MASK = (1 << 40) - 1

#: the default eager limit. Eager beats rendezvous at every size up to 256 KiB on Soft-RoCE
#: (one round trip less; the copies are cheap next to it: docs/verbs.md), so the limit is set
#: by memory instead: 16 ring buffers of 64 KiB per peer and direction (2 MiB per peer with
#: the send slots)
EAGER_MAX = 64 << 10
#: rendezvous writes: at most this many bytes per work request
CHUNK_BYTES = 1 << 20
SQ_DEPTH = 256
DATA_RQ_DEPTH = 128
INLINE_BYTES = 128


def wr_id(kind: int, qp: int, index: int) -> int:
    """The id of a work request: what it is for, on which queue pair, for which slot,
    buffer or message."""
    return (kind << 48) | (qp << 40) | index


def wr_fields(wr: int) -> tuple[int, int, int]:
    """(kind, queue pair, index) of a work request id (``wr_id``)."""
    return wr >> 48, (wr >> 40) & 0xFF, wr & INDEX_MASK


class QpAddresses(NamedTuple):
    """One side's queue-pair addresses, as the setup socket carries them (``INFO``)."""

    magic: bytes
    gid: bytes              # NUL-padded text
    lid: int
    psn: int                # first packet sequence number of every queue pair
    ring_slots: int         # receive buffers of the eager ring (the sender's credits)
    nqps: int               # control queue pair + data queue pairs
    eager_max: int
    credit_rkey: int        # where the peer RDMA-writes its count of re-posted buffers
    credit_addr: int
    mtu: int
    qpns: tuple[int, ...]   # the queue pair numbers, control first

    def pack(self) -> bytes:
        padding = (0,) * (MAX_QPS - len(self.qpns))
        return INFO.pack(*self[:10], *self.qpns, *padding)

    @classmethod
    def unpack(cls, data: bytes) -> QpAddresses:
        fields = INFO.unpack(data)
        return cls._make(fields[:10] + (tuple(fields[10:10 + fields[5]]),))


def peer_addresses(data: bytes, peer: int, nqps: int, eager_max: int) -> QpAddresses:
    """The peer's queue-pair addresses from the ``INFO.size`` bytes its setup socket carried,
    checked before anything uses them: the magic, the queue-pair count and eager limit this
    rank was configured with, a ring size and MTU the protocol can work with, and a GID that
    is text. The setup socket is proven to come from a rank of the job (``wireup``), but a
    rank of another pycoll version, or configured otherwise, must fail the pair with a clear
    error rather than connect queue pairs that disagree."""
    theirs = QpAddresses.unpack(data)
    if theirs.magic != INFO_MAGIC:
        raise TransportError(f"verbs: peer rank {peer} sent no queue-pair addresses on the "
                             "setup connection (another pycoll version?)", peer=peer)
    if theirs.nqps != nqps or theirs.eager_max != eager_max:
        raise TransportError(
            f"verbs: peer rank {peer} sent queue-pair addresses this rank cannot use "
            f"({theirs.nqps} queue pairs and eager limit {theirs.eager_max} where this rank "
            f"has {nqps} and {eager_max}): set PYCOLL_IB_QPS_PER_PEER and PYCOLL_IB_EAGER_MAX "
            "alike on every rank", peer=peer)
    gid = theirs.gid.rstrip(b"\0")
    if (not 0 < theirs.ring_slots < 1 << 20 or theirs.mtu not in (1, 2, 3, 4, 5)
            or not gid.isascii() or not gid.decode().replace(":", "").isalnum()):
        raise TransportError(
            f"verbs: peer rank {peer} sent malformed queue-pair addresses (ring of "
            f"{theirs.ring_slots} buffers, MTU code {theirs.mtu}, GID {gid[:40]!r}): is it "
            "another pycoll version?", peer=peer)
    return theirs


class ControlMessage(NamedTuple):
    """A message for the peer's ring (``HDR``'s fields, then ``payload``), queued until a
    credit, a send slot and send-queue room are there."""

    kind: int
    aux: int
    tag: int
    nbytes: int
    ident: int
    addr: int
    payload: memoryview | None = None
    req: Request | None = None          # an eager send: complete once copied
    wr_kind: int = WR_SLOT
    wr_index: int = 0


class PutWrite(NamedTuple):
    """A piece of a put's bytes, RDMA-written ahead of its notice."""

    remote: tuple[int, int]             # (address, rkey) at the peer
    addr: int
    length: int
    lkey: int
    put_id: int


class RndvWrite(NamedTuple):
    """A piece of a rendezvous send, RDMA-written into the receiver's buffer; the last
    piece on each queue pair carries ``imm`` (the receive's id) as immediate data."""

    qp: int
    src: int
    length: int
    lkey: int
    remote: tuple[int, int]
    imm: int | None
    send_id: int


class WindowRdma(NamedTuple):
    """A piece of a window's put or get (``window.py``): an RDMA WRITE or READ between this
    rank's registered buffer and the peer's window, signaled so that the operation completes
    when its last piece does; or a signal's fetch-and-add on the peer's counter word (the
    old value lands in this rank's 8 bytes at ``addr``)."""

    opcode: int
    remote: tuple[int, int]             # (address, rkey) at the peer
    addr: int
    length: int
    lkey: int
    op_id: int
    add: int | None = None              # a fetch-and-add of this value (a signal) instead
