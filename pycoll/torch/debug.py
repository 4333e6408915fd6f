"""The pycoll groups' state on torch's debug server (``torch.distributed.debug``).

torch 2.13's ``start_debug_server`` runs a C++ worker server on every rank (``_WorkerServer``)
and a frontend on rank 0 that asks all workers at once (``fetch_all(name)``, each worker's
``/handler/<name>``). Python may add handlers by name (``_register_handler``): pycoll adds
``pycoll_status``, every live pycoll group's ``Communicator.status()`` (what ``pycoll.status``
shows: state, the call and its number, for how long, the flight recorder's recent calls),
answered from the server's thread like the status port. The handler is registered when the
first pycoll group is made (where this torch has the hook), and costs nothing until asked.
"""
from __future__ import annotations

import json
import threading
import weakref
from typing import Any

from .. import debug

#: the name the handler is served under (``/handler/pycoll_status``)
HANDLER = "pycoll_status"

_groups: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_registered = False


def _status(req: Any, resp: Any) -> None:
    groups = []
    for pg in list(_groups):
        try:
            groups.append({"group": pg.getGroupName(), **pg.comm.status()})
        except Exception as e:  # noqa: BLE001 - one group's trouble is its answer
            groups.append({"group": pg.getGroupName(), "error": str(e)})
    resp.set_content(json.dumps({"groups": groups}, default=str).encode(), "application/json")
    resp.set_status(200)


def track(pg: Any) -> None:
    """Serve ``pg``'s state on torch's worker server while it lives."""
    global _registered
    with _lock:
        _groups.add(pg)
        if _registered:
            return
        _registered = True
        try:
            from torch._C._distributed_c10d import _register_handler
        except ImportError:      # a torch without the debug server: nothing to serve on
            return
        try:
            _register_handler(HANDLER, _status)
        except Exception as e:  # noqa: BLE001 - a debugging aid must not stop the group
            debug.logger.info("torch debug server: %s not registered: %s", HANDLER, e)
