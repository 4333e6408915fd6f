"""Exception hierarchy of the rendezvous store.

Every error the store raises derives from :class:`StoreError` (itself a ``RuntimeError``, as
c10d's ``DistStoreError`` is), so callers that only want "the bootstrap failed" catch one type,
while launchers that want to tell a slow peer from a wrong address from a wrong token can catch
the subclasses.
"""

from __future__ import annotations

__all__ = [
    "StoreError",
    "StoreTimeout",
    "StoreConnectError",
    "StoreConnectionLost",
    "AuthError",
    "StoreProtocolError",
    "StoreLimitError",
]


class StoreError(RuntimeError):
    """Base class of every error raised by the rendezvous store."""


class StoreTimeout(StoreError, TimeoutError):
    """A call did not complete before its deadline (e.g. keys that never appeared).

    Also a ``TimeoutError`` so generic timeout handling catches it. The message names the keys
    that were still missing and the deadline that expired, because "which rank never showed
    up" is the first question anyone asks after a stuck bootstrap.
    """


class StoreConnectError(StoreError, ConnectionError):
    """The client could not reach (connect + handshake) the server before its deadline."""


class StoreConnectionLost(StoreError, ConnectionError):
    """The server closed the connection (or died) while a call was in flight.

    Raised promptly instead of hanging. The client object reconnects on its next call, but the
    failed call is not retried, since it may not be idempotent (``add``).
    """


class AuthError(StoreError, PermissionError):
    """Token authentication failed (wrong token, missing token, or the server cannot prove it
    knows the token)."""


class StoreProtocolError(StoreError):
    """The peer sent something that does not follow the wire protocol, or the server rejected a
    request as invalid (its message is forwarded here)."""


class StoreLimitError(StoreError, ValueError):
    """A key or value exceeds the size limits the server announced."""
