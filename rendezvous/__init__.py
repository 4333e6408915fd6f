"""rendezvous: the small, fast, hardened TCP key-value store that bootstraps every pycoll job.

Modelled on the c10d ``TCPStore`` command set (set/get/add/compare_set/wait/check/delete/
num_keys/append/multi_get/multi_set). One process hosts the server (``TCPStore(...,
is_server=True)``, :class:`StoreServer`, or ``python -m rendezvous serve``); every rank connects
as a client. :class:`Store` is the protocol pycoll needs of any store (this one, ``LocalStore``,
a ``PrefixStore`` view, torch's through an adapter). See docs/rendezvous.md for the wire
protocol and the security model.
"""

from .client import TCPStore
from .errors import (
    AuthError,
    StoreConnectError,
    StoreConnectionLost,
    StoreError,
    StoreLimitError,
    StoreProtocolError,
    StoreTimeout,
)
from .local import LocalStore
from .prefix import PrefixStore
from .server import StoreServer
from .store import Store

__all__ = [
    "Store",
    "TCPStore",
    "PrefixStore",
    "LocalStore",
    "StoreServer",
    "StoreError",
    "StoreTimeout",
    "StoreConnectError",
    "StoreConnectionLost",
    "AuthError",
    "StoreProtocolError",
    "StoreLimitError",
]
