"""Tag matching, shared by every transport (UCX keeps it above its transports, in UCP).

A channel receives messages in the order the peer sent them. Each arriving message goes to
the oldest posted receive with its tag; if there is none it is held as *unexpected* (with a
transport-specific payload: the bytes, or a descriptor such as "read it from this address")
until a receive with that tag is posted. Sizes must agree exactly: a disagreement means the
ranks run different collectives or pass different tensors, and is reported, never truncated.
"""
from __future__ import annotations

from collections import deque
from typing import Any

from .base import Request


class TagMatcher:
    """Posted receives and unexpected messages of one channel."""

    __slots__ = ("posted", "unexpected")

    def __init__(self) -> None:
        self.posted: deque[Request] = deque()
        self.unexpected: deque[tuple[int, int, Any]] = deque()   # (tag, nbytes, payload)

    def post(self, req: Request) -> tuple[int, Any] | None:
        """Post ``req``; if a message with its tag is already held, return (nbytes, payload)
        of the oldest one instead (the caller delivers it)."""
        tag = req.tag
        unexpected = self.unexpected
        if unexpected:
            for i, (utag, nbytes, payload) in enumerate(unexpected):
                if utag == tag:
                    del unexpected[i]
                    return nbytes, payload
        self.posted.append(req)
        return None

    def take(self, tag: int) -> Request | None:
        """Remove and return the oldest posted receive with ``tag`` (usually the first)."""
        posted = self.posted
        if posted and posted[0].tag == tag:
            return posted.popleft()
        for i, req in enumerate(posted):
            if req.tag == tag:
                del posted[i]
                return req
        return None

    def hold(self, tag: int, nbytes: int, payload: Any) -> None:
        """Keep a message nobody has asked for yet."""
        self.unexpected.append((tag, nbytes, payload))

    def fail_all(self, error: BaseException) -> None:
        for req in self.posted:
            req.fail(error)
        self.posted.clear()

    def __bool__(self) -> bool:
        return bool(self.posted)
