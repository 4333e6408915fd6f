"""Message tags: what every message says about the call it belongs to.

User point-to-point tags are >= 0 (``p2p_tag``: the communicator id sits above them).
Collective messages carry a negative tag (``collective_tag``) made of, from the low bits up:

* the collective's code (6 bits) and the communicator id (20 bits): sub-communicators share
  their parent's channels and never match each other's messages;
* the call's *signature* (16 bits): a hash of what this rank believes the call is (collective,
  dtype, element count, op with its premul factor, root). Ranks that disagree, say float32
  against int32 with the same byte count, put different signatures on their messages;
* the call's sequence number (20 bits, wrapping): every call of a communicator has its own.

Matching is exact, so messages of disagreeing ranks never meet. ``conflicts`` is what the
matcher uses to turn that into an error at once instead of a hang: a message and a receive of
the same communicator whose tags differ although the message's call is not a later one than
the receive's (the same call with another signature or collective, or an earlier call whose
message nobody received: e.g. two ranks that both believed they were a broadcast's root).
A message from a later call is legitimate: a fast peer is already there.
"""
from __future__ import annotations

import zlib
from typing import Any

CODE_BITS, COMM_BITS, SIG_BITS, SEQ_BITS = 6, 20, 16, 20
COMM_SHIFT = CODE_BITS
SIG_SHIFT = CODE_BITS + COMM_BITS
SEQ_SHIFT = SIG_SHIFT + SIG_BITS
SEQ_MASK = (1 << SEQ_BITS) - 1
SIG_MASK = (1 << SIG_BITS) - 1
COMM_MASK = (1 << COMM_BITS) - 1
#: user point-to-point tags must be below this (the communicator id sits above them)
P2P_TAG_LIMIT = 1 << 40

COLLECTIVE_NAMES = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter",
                    "alltoall", "gather", "scatter", "barrier", "allreduce_coalesced", "split",
                    "allgather_coalesced", "allgatherv", "link_probe")
_CODES = {name: code for code, name in enumerate(COLLECTIVE_NAMES, start=1)}


def tag_low_bits(collective: str, comm_id: int = 0) -> int:
    """The collective's code and the communicator's id: the tag's lowest bits."""
    return (comm_id << COMM_SHIFT) | _CODES.get(collective, 63)


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


def p2p_tag(tag: int, comm_id: int = 0) -> int:
    """The wire tag of a user's point-to-point ``tag`` (>= 0) on communicator ``comm_id``."""
    return tag + comm_id * P2P_TAG_LIMIT


_SIGNATURES: dict[Any, int] = {}


def signature(collective: str, sig: tuple) -> int:
    """16 bits that differ (but for a 1 in 65536 chance) when two ranks' calls differ in
    collective, dtype, count, op (premul factor included) or root. Deterministic across
    processes (``hash()`` of a string is not); cached, so a repeated call costs a lookup."""
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
    about the call that posted ``receive_tag`` (see the module docstring)."""
    if message_tag >= 0 or receive_tag >= 0 or message_tag == receive_tag:
        return False
    m, r = -message_tag - 1, -receive_tag - 1
    if (m >> COMM_SHIFT) & COMM_MASK != (r >> COMM_SHIFT) & COMM_MASK:
        return False
    later = ((m >> SEQ_SHIFT) - (r >> SEQ_SHIFT)) & SEQ_MASK
    return later == 0 or later > SEQ_MASK // 2


def describe_tag(tag: int) -> str:
    """``allreduce #12 (signature 3fa2)`` for a collective tag; ``tag 5`` for a user's."""
    if tag >= 0:
        return f"point-to-point tag {tag % P2P_TAG_LIMIT}"
    v = -tag - 1
    code = v & ((1 << CODE_BITS) - 1)
    name = COLLECTIVE_NAMES[code - 1] if 1 <= code <= len(COLLECTIVE_NAMES) else "?"
    return f"{name} #{v >> SEQ_SHIFT} (signature {(v >> SIG_SHIFT) & SIG_MASK:04x})"
