"""Wire protocol shared by the rendezvous server and client.

Everything on the wire is a *frame*: a 4-byte big-endian unsigned payload length followed by
that many payload bytes. Length prefixes make parsing trivial and let the server reject an
oversized frame from its header alone, before buffering anything (docs/rendezvous.md has the
full description).

Handshake (first three frames of every connection)::

    server -> HELLO   magic u32 | version u8 | flags u8 | max_key u32 | max_value u64 | nonce[32]
    client -> LOGIN   magic u32 | version u8 | client_nonce[32] | mac_len u8 | mac[mac_len]
    server -> WELCOME status u8 | mac_len u8 | mac[mac_len]

With TLS (``tls.py``) the server first sends a plain HELLO with ``FLAG_TLS_REQUIRED`` and a
zero nonce; both sides then run a TLS 1.3 handshake on the socket, and the three frames above
follow inside it.

With a token, ``mac`` is HMAC-SHA256(token, b"rdzv-client" + nonce + client_nonce) and the
server answers with HMAC-SHA256(token, b"rdzv-server" + nonce + client_nonce), so both sides
prove knowledge of the token without sending it, and a recorded exchange cannot be replayed
(fresh nonces) or reflected (distinct labels).

After the handshake, requests and responses share one layout::

    request  payload: op u8     | arg i64 | blob list
    response payload: status u8 | arg i64 | blob list
    blob list:        count u32 | count x len u32 | concatenated blob bytes

``arg`` carries the one integer an operation needs (timeout in ms, amount, result); blobs carry
keys and values. Encoding all lengths as one array lets both sides (un)pack a 1000-key
``multi_get`` with a single ``struct`` call instead of a Python loop per key.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import itertools
import struct
from collections.abc import Sequence

MAGIC = 0x52445A56  # "RDZV"
VERSION = 1

FRAME_HEADER = struct.Struct(">I")
HELLO = struct.Struct(">IBBIQ32s")
LOGIN_FIXED = struct.Struct(">IB32sB")
WELCOME_FIXED = struct.Struct(">BB")
REQ_HEAD = struct.Struct(">BqI")  # op/status, arg, blob count

NONCE_SIZE = 32
MAC_SIZE = 32
FLAG_AUTH_REQUIRED = 0x01
#: the server speaks TLS: this HELLO (plain, nonce zero) only says so; the client starts a TLS
#: handshake on the same socket and the real HELLO follows inside it (STARTTLS-style, so that
#: a client without certificates hears why it is refused instead of timing out)
FLAG_TLS_REQUIRED = 0x02

#: frames exchanged before authentication are tiny; anything larger is hostile.
MAX_HANDSHAKE_FRAME = 256

DEFAULT_MAX_KEY_SIZE = 4 * 1024
DEFAULT_MAX_VALUE_SIZE = 64 * 1024 * 1024


class Op(enum.IntEnum):
    """Request opcodes (modelled on c10d's ``QueryType``)."""

    PING = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    NUM_KEYS = 7
    DELETE = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    #: set a key now and another value when this connection closes (``TCPStore.lease``)
    LEASE = 12


class Status(enum.IntEnum):
    OK = 0
    TIMEOUT = 1  # blobs: the keys still missing when the server-side deadline expired
    ERROR = 2  # blobs: [utf-8 message]


class WelcomeStatus(enum.IntEnum):
    OK = 0
    AUTH_FAILED = 1
    BAD_VERSION = 2


def client_mac(token: bytes, server_nonce: bytes, nonce: bytes, service: bytes = b"rdzv") -> bytes:
    """The client's proof; ``service`` keeps the proofs of different services that share
    this handshake (the store, pycoll's status responder) apart."""
    return hmac.new(token, service + b"-client" + server_nonce + nonce, hashlib.sha256).digest()


def server_mac(token: bytes, server_nonce: bytes, nonce: bytes, service: bytes = b"rdzv") -> bytes:
    return hmac.new(token, service + b"-server" + server_nonce + nonce, hashlib.sha256).digest()


def encode_message(code: int, arg: int, blobs: Sequence[bytes] = ()) -> bytes:
    """Encode a complete frame (length prefix included) for a request or response."""
    n = len(blobs)
    if n == 0:
        body = REQ_HEAD.pack(code, arg, 0)
    elif n == 1:
        b = blobs[0]
        body = b"".join((REQ_HEAD.pack(code, arg, 1), FRAME_HEADER.pack(len(b)), b))
    else:
        lens = struct.pack(f">{n}I", *map(len, blobs))
        body = b"".join((REQ_HEAD.pack(code, arg, n), lens, *blobs))
    return FRAME_HEADER.pack(len(body)) + body


class MalformedFrame(ValueError):
    """Raised by :func:`decode_message` for payloads that do not follow the layout."""


def decode_message(payload: bytes | bytearray) -> tuple[int, int, list[bytes]]:
    """Decode a request/response payload (without its length prefix).

    Validates every length against the payload size, so random bytes can never make the
    decoder allocate or slice beyond what was actually received.
    """
    size = len(payload)
    if size < REQ_HEAD.size:
        raise MalformedFrame(f"payload of {size} bytes is shorter than the "
                             f"{REQ_HEAD.size}-byte header")
    code, arg, n = REQ_HEAD.unpack_from(payload, 0)
    pos = REQ_HEAD.size
    if n > (size - pos) // 4:
        raise MalformedFrame(f"blob count {n} does not fit in a {size}-byte payload")
    if n == 0:
        if size != pos:
            raise MalformedFrame("trailing bytes after an empty blob list")
        return code, arg, []
    lens = struct.unpack_from(f">{n}I", payload, pos)
    pos += 4 * n
    if sum(lens) != size - pos:
        raise MalformedFrame("blob lengths do not add up to the payload size")
    ends = list(itertools.accumulate(lens, initial=pos))
    if not isinstance(payload, bytes) and size <= (1 << 20):
        payload = bytes(payload)  # one cheap copy; slicing bytes beats memoryview slices
    if isinstance(payload, bytes):
        return code, arg, [payload[a:b] for a, b in zip(ends, ends[1:])]
    view = memoryview(payload)  # copy each blob out exactly once, as bytes
    return code, arg, [bytes(view[a:b]) for a, b in zip(ends, ends[1:])]
