"""Message tags: what every message says about the call it belongs to.

User point-to-point tags are >= 0 (``p2p_tag``): from the low bits up, the user's tag (40
bits), the communicator id (12 bits) and the code of the dtype sent (6 bits), so that a
receive posted with another dtype never matches the message and ``conflicts`` reports both
dtypes before a byte lands in the receiver's buffer.

Collective messages carry a negative tag (``collective_tag``, ``-word - 1``) whose word holds,
from the low bits up (63 bits in all):

* the collective's code (5 bits) and the *agreement* bit: set on the small messages that
  rooted collectives exchange to prove that every rank agrees about the call
  (``agreement_tag``; algorithms/agreement.py), clear on the data;
* the communicator id (12 bits): sub-communicators share their parent's channels and never
  match each other's messages;
* the call's *signature* (32 bits): a hash of what this rank believes the call is (collective,
  dtype, element count, op with its premul factor, root, fold). Ranks that disagree, say
  float32 against int32 with the same byte count, or about the root, put different
  signatures on their messages; two disagreeing calls pass unnoticed with a chance of 1 in
  2^32;
* the call's sequence number (13 bits, wrapping): every call of a communicator has its own.
  Ranks of a communicator are never more than a few calls apart while messages flow
  (every collective that moves data waits for every rank), so 8192 numbers leave room.

Matching is exact, so messages of disagreeing ranks never meet. ``conflicts`` is what the
matcher uses to turn that into an error at once instead of a hang: a message and a receive of
the same communicator whose tags differ although the message's call is not a later one than
the receive's (the same call with another signature or collective, or an earlier call whose
message nobody received: e.g. two ranks that both believed they were a broadcast's root).
A message from a later call is legitimate: a fast peer is already there; so is the agreement
message of the very call a receive is waiting for data of.
"""
from __future__ import annotations

import zlib
from typing import Any

CODE_BITS, AGREE_BITS, COMM_BITS, SIG_BITS, SEQ_BITS = 5, 1, 12, 32, 13
AGREE_BIT = 1 << CODE_BITS
COMM_SHIFT = CODE_BITS + AGREE_BITS
SIG_SHIFT = COMM_SHIFT + COMM_BITS
SEQ_SHIFT = SIG_SHIFT + SIG_BITS
SEQ_MASK = (1 << SEQ_BITS) - 1
SIG_MASK = (1 << SIG_BITS) - 1
COMM_MASK = (1 << COMM_BITS) - 1
CODE_MASK = (1 << CODE_BITS) - 1
assert SEQ_SHIFT + SEQ_BITS == 63      # a word fits a negative int64 tag
#: user point-to-point tags must be below this (the communicator id sits above them)
P2P_TAG_LIMIT = 1 << 40
#: where a point-to-point tag keeps the sender's dtype code (above the communicator id)
DTYPE_SHIFT = 40 + COMM_BITS
_P2P_LOW = (1 << DTYPE_SHIFT) - 1
#: one-sided window traffic where the target's progress serves it (tcp): a request carries
#: exactly this tag, replies ``WINDOW_TAG + 1 + n``. Above every point-to-point tag (those
#: end below bit 58), so they never match nor conflict with a user's or a collective's
WINDOW_TAG = 1 << 62

COLLECTIVE_NAMES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                    "alltoall", "gather", "scatter", "barrier", "allreduce_coalesced", "split",
                    "allgather_coalesced", "allgatherv", "link_probe", "reduce_scatter_v",
                    "gatherv", "scatterv")
_CODES = {name: code for code, name in enumerate(COLLECTIVE_NAMES, start=1)}
_UNKNOWN_CODE = CODE_MASK
#: dtype codes of point-to-point tags (0: not said; names not listed share code 63)
DTYPE_NAMES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
               "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
               "complex128", "float8_e4m3fn", "float8_e5m2")
_DTYPE_CODES = {name: code for code, name in enumerate(DTYPE_NAMES, start=1)}


def tag_low_bits(collective: str, comm_id: int = 0) -> int:
    """The collective's code and the communicator's id: the tag's lowest bits."""
    return (comm_id << COMM_SHIFT) | _CODES.get(collective, _UNKNOWN_CODE)


def call_bits(low: int, sig: int) -> int:
    """What a call's tag says besides its sequence number: ``low`` (``tag_low_bits``: the
    collective and the communicator) and its signature ``sig``; the same for every call of
    one kind."""
    return (sig << SIG_SHIFT) | low


def call_word(seq: int, bits: int) -> int:
    """Call number ``seq`` of the kind ``bits`` (``call_bits``) as one non-negative word, as
    the fast path's slots carry it. Its message tag is ``-word - 1``."""
    return ((seq & SEQ_MASK) << SEQ_SHIFT) | bits


def collective_tag(seq: int, low: int, sig: int) -> int:
    """The (negative) message tag of call number ``seq`` with signature ``sig``; ``low`` is
    ``tag_low_bits(collective, comm_id)``."""
    return -call_word(seq, call_bits(low, sig)) - 1


def agreement_tag(tag: int) -> int:
    """The tag of the agreement messages of the call whose data messages carry ``tag``: the
    same call and signature with the agreement bit set, so that the two never match each
    other and neither is taken for a disagreement (``conflicts``)."""
    return -((-tag - 1) | AGREE_BIT) - 1


def dtype_code(dtype: str | None) -> int:
    """The 6-bit code of a dtype name in point-to-point tags (0 for None)."""
    if dtype is None:
        return 0
    return _DTYPE_CODES.get(dtype, 63)


def p2p_tag(tag: int, comm_id: int = 0, dtype: str | None = None) -> int:
    """The wire tag of a user's point-to-point ``tag`` (>= 0) on communicator ``comm_id``,
    sending or receiving ``dtype`` (pycoll's dtype name)."""
    return tag + comm_id * P2P_TAG_LIMIT + (dtype_code(dtype) << DTYPE_SHIFT)


_SIGNATURES: dict[Any, int] = {}


def signature(collective: str, sig: tuple) -> int:
    """32 bits that differ (but for a 1 in 2^32 chance) when two ranks' calls differ in
    collective, dtype, count, op (premul factor included), root or fold. Deterministic
    across processes (``hash()`` of a string is not); cached, so a repeated call costs a
    lookup."""
    key = (collective, sig)
    try:
        return _SIGNATURES[key]
    except KeyError:
        value = zlib.crc32(repr(key).encode()) & SIG_MASK
        if len(_SIGNATURES) < 4096:
            _SIGNATURES[key] = value
        return value
    except TypeError:          # a list inside (allreduce_coalesced's counts): not cached
        return zlib.crc32(repr(key).encode()) & SIG_MASK


def conflicts(message_tag: int, receive_tag: int) -> bool:
    """Whether a message with ``message_tag`` proves that its sender and this rank disagree
    about the call that posted ``receive_tag`` (see the module docstring). Point-to-point:
    a message with the receive's user tag and communicator but another dtype."""
    if message_tag == receive_tag:
        return False
    if message_tag >= 0 or receive_tag >= 0:
        return (0 <= message_tag < WINDOW_TAG and 0 <= receive_tag < WINDOW_TAG
                and message_tag & _P2P_LOW == receive_tag & _P2P_LOW)
    m, r = -message_tag - 1, -receive_tag - 1
    if (m >> COMM_SHIFT) & COMM_MASK != (r >> COMM_SHIFT) & COMM_MASK:
        return False
    if m ^ r == AGREE_BIT:          # the data and the agreement messages of one call
        return False
    later = ((m >> SEQ_SHIFT) - (r >> SEQ_SHIFT)) & SEQ_MASK
    return later == 0 or later > SEQ_MASK // 2


def tag_dtype(tag: int) -> str | None:
    """The dtype a point-to-point tag names (None: not said, or a collective tag)."""
    code = tag >> DTYPE_SHIFT if 0 <= tag < WINDOW_TAG else 0
    if 1 <= code <= len(DTYPE_NAMES):
        return DTYPE_NAMES[code - 1]
    return "another dtype" if code else None


def describe_tag(tag: int) -> str:
    """``allreduce #12 (signature 3fa2c001)`` for a collective tag (``broadcast #3
    (agreement message, signature ...)`` for an agreement message); ``point-to-point tag 5
    of float32`` for a user's."""
    if tag >= WINDOW_TAG:
        return "window request" if tag == WINDOW_TAG else f"window reply {tag - WINDOW_TAG}"
    if tag >= 0:
        dtype = tag_dtype(tag)
        text = f"point-to-point tag {tag % P2P_TAG_LIMIT}"
        return text if dtype is None else f"{text} of {dtype}"
    v = -tag - 1
    code = v & CODE_MASK
    name = COLLECTIVE_NAMES[code - 1] if 1 <= code <= len(COLLECTIVE_NAMES) else "?"
    what = "agreement message, " if v & AGREE_BIT else ""
    return f"{name} #{v >> SEQ_SHIFT} ({what}signature {(v >> SIG_SHIFT) & SIG_MASK:08x})"
