"""Tag matching, shared by every transport (UCX keeps it above its transports, in UCP).

A channel receives messages in the order the peer sent them. Each arriving message goes to
the oldest posted receive with its tag; if there is none it is held as *unexpected* (with a
transport-specific payload: the bytes, or a descriptor such as "read it from this address")
until a receive with that tag is posted. Sizes must agree exactly: a disagreement means the
ranks run different collectives or pass different tensors, and is reported, never truncated.
A collective's tag also carries the call's signature (``pycoll/tags.py``): a held message whose
tag proves that its sender disagrees about the call a receive was posted for (another dtype,
op, root, collective...) fails that receive with ``CollectiveMismatch`` instead of leaving it
to wait for a match that can never come; so does a point-to-point message whose tag names
another dtype than the receive's, before a byte of it lands in the receiver's buffer. The
check runs when a wait goes idle (``refuse_conflicts``, from the progress engine), never on
the matching hot path: a disagreement always leaves a receive waiting, so it is found within
the first idle moment.

A receive from *any* source (torch's ``recv`` without ``src``, MPI_ANY_SOURCE) is one receive
posted on every channel, tied together by an ``AnySource``: the first of them that a message
matches claims the group, which withdraws the others from their channels at that moment,
before a byte of a second message could land. Messages of each source still match in the
order that source sent them.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import chain
from typing import Any

from ..buffers.memory import MemRef
from ..errors import CollectiveMismatch
from ..tags import conflicts, describe_tag, tag_dtype


class Request:
    """One posted send or receive. ``done`` flips once; ``error`` is set on failure."""

    __slots__ = ("channel", "mem", "view", "tag", "nbytes", "done", "error", "bytes_done",
                 "kind", "group")

    def __init__(self, channel: Any, mem: MemRef, tag: int, kind: str) -> None:
        self.channel = channel         # the transports.base.Channel that posted it
        self.mem = mem
        # Host bytes. Device memory has none (None): only transports declaring device
        # memory receive such requests, and they use ``mem`` instead.
        self.view: memoryview = mem.view
        self.tag = tag
        self.nbytes = mem.nbytes
        self.done = False
        self.error: BaseException | None = None
        self.bytes_done = 0
        self.kind = kind  # "send", "recv" or "put"
        #: the ``matching.AnySource`` this receive is one alternative of (any-source receives)
        self.group: Any = None

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self.done = True

    def complete(self) -> None:
        self.bytes_done = self.nbytes
        self.done = True

    def __repr__(self) -> str:
        return (f"<{self.kind} peer={self.channel.peer} tag={self.tag} "
                f"{self.bytes_done}/{self.nbytes}B {'done' if self.done else 'pending'}>")


class TagMatcher:
    """Posted receives and unexpected messages of one channel."""

    __slots__ = ("posted", "unexpected", "peer")

    def __init__(self, peer: int) -> None:
        self.posted: deque[Request] = deque()
        self.unexpected: deque[tuple[int, int, Any]] = deque()   # (tag, nbytes, payload)
        self.peer = peer

    def take_held(self, req: Request) -> tuple[int, Any] | None:
        """Remove and return (nbytes, payload) of the oldest held message with ``req``'s tag:
        a new receive looks here first (the caller delivers it), and is posted otherwise.
        """
        tag = req.tag
        unexpected = self.unexpected
        for i, (utag, nbytes, payload) in enumerate(unexpected):
            if utag == tag:
                del unexpected[i]
                return nbytes, payload
        return None

    def refuse_conflicts(self) -> bool:
        """Fail every posted receive that a held message proves wrong (see the module
        docstring); True if one failed. Called while a wait is idle."""
        found = False
        if self.unexpected and self.posted:
            for req in list(self.posted):
                for utag, _n, _p in self.unexpected:
                    if conflicts(utag, req.tag):
                        self.posted.remove(req)
                        req.fail(self._mismatch(utag, req.tag))
                        found = True
                        break
        return found

    def check_leftovers(self, tag: int, unread: Sequence[int] = ()) -> None:
        """After a call with ``tag`` completed: a held message (or one not yet read, with a
        tag in ``unread``) of this call or an earlier one of the same communicator was sent
        for a receive that was never posted (two ranks that both believed they were a
        broadcast's root, say). Raise ``CollectiveMismatch``. Costs nothing unless messages
        are held (usually ones of the next call: fine)."""
        for utag in chain((t for t, _n, _p in self.unexpected), unread):
            # the usual held message is one of a later call (a peer already there), which
            # ``conflicts`` lets pass; a message of this call with a larger signature has a
            # more negative tag too, so the tags' order cannot decide
            if conflicts(utag, tag):
                raise self._mismatch(utag, tag)

    def _mismatch(self, message_tag: int, receive_tag: int) -> CollectiveMismatch:
        if receive_tag >= 0:
            return CollectiveMismatch(
                f"peer rank {self.peer} sent {tag_dtype(message_tag) or 'untyped'} data "
                f"({describe_tag(message_tag)}) where this rank posted a receive of "
                f"{tag_dtype(receive_tag) or 'untyped data'}: send and recv must use the "
                "same dtype (to move raw bytes, view both buffers as uint8). Nothing was "
                "written into the receive buffer", peer=self.peer)
        return CollectiveMismatch(
            f"peer rank {self.peer} sent a message of {describe_tag(message_tag)} where this "
            f"rank is in {describe_tag(receive_tag)}: the two ranks disagree on the collective "
            "or on its arguments (dtype, element count, op or premul factor, root), or one of "
            "them skipped a call. Hint: PYCOLL_DEBUG=DETAIL reports who called what",
            peer=self.peer)

    def take(self, tag: int) -> Request | None:
        """Remove and return the oldest posted receive with ``tag`` (usually the first)."""
        posted = self.posted
        if posted and posted[0].tag == tag:
            req = posted.popleft()
        else:
            for i, req in enumerate(posted):
                if req.tag == tag:
                    del posted[i]
                    break
            else:
                return None
        if req.group is not None:
            req.group.claim(req)
        return req

    def hold(self, tag: int, nbytes: int, payload: Any) -> None:
        """Keep a message nobody has asked for yet."""
        self.unexpected.append((tag, nbytes, payload))

    def fail_all(self, error: BaseException) -> None:
        """The channel broke: every posted receive fails with ``error``, but one that a held
        message proves wrong fails with that disagreement (the root cause: a peer that sent
        the wrong dtype and then finished looks like a lost peer otherwise)."""
        self.refuse_conflicts()
        for req in self.posted:
            req.fail(error)
        self.posted.clear()

    def __bool__(self) -> bool:
        return bool(self.posted)


class AnySource:
    """The alternatives of one receive from any source (see the module docstring)."""

    __slots__ = ("members", "matched")

    def __init__(self) -> None:
        self.members: list[tuple[TagMatcher, Request]] = []
        #: the receive a message matched; None while every alternative still waits
        self.matched: Request | None = None

    def enlist(self, matcher: TagMatcher, req: Request) -> None:
        """``req`` was just posted on the channel of ``matcher``. If a held message matched
        it already, it wins at once; otherwise it waits as one alternative."""
        if req in matcher.posted:
            req.group = self
            self.members.append((matcher, req))
        elif req.error is None:
            self.claim(req)
        # else it failed at once (its source is gone): not an alternative at all

    def withdraw(self) -> None:
        """The receive failed: take every alternative still waiting off its channel."""
        members, self.members = self.members, []
        for matcher, other in members:
            other.group = None
            try:
                matcher.posted.remove(other)
            except ValueError:
                continue
            other.done = True

    def claim(self, req: Request) -> None:
        """A message matched ``req``: withdraw every other alternative (they complete empty)."""
        self.matched = req
        members, self.members = self.members, []
        for matcher, other in members:
            other.group = None
            if other is req:
                continue
            try:
                matcher.posted.remove(other)
            except ValueError:
                pass
            other.done = True
