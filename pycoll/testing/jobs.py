"""Job functions that the Spark and Ray tests (and their namespace-host drivers) run as
ranks: module-level, so that both frameworks ship them by reference to their workers."""
from __future__ import annotations

from typing import Any


def allreduce_report(comm: Any, n: int) -> dict[str, Any]:
    """An exact allreduce of ``n`` float64 (small integers), and where this rank ran: its
    rank, size, hostname, whether the result was exact, the transports it used."""
    import socket

    import numpy as np

    x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
    comm.allreduce(x)
    expected = np.arange(n, dtype=np.float64) * sum(range(1, comm.size + 1))
    return {"rank": comm.rank, "size": comm.size, "host": socket.gethostname(),
            "exact": bool((x == expected).all()), "transports": comm.transport_summary()}


def store_stranger(comm: Any) -> tuple[float, list[str]]:
    """Rank 1 plays a stranger before joining in: it reaches rank 0's store (the address the
    bootstrap handed it) without the secret and with a wrong one, and records how it was
    refused ("let in" if it was not); then every rank allreduces rank + 1."""
    import numpy as np

    from rendezvous import TCPStore

    refused = []
    if comm.rank == 1:
        host, port = comm.store_address
        for token in ("", "0" * 32):
            try:
                TCPStore(host, port, token=token, timeout=5).get("pycoll/job-secret")
                refused.append("let in")
            except Exception as e:  # noqa: BLE001 - what the stranger is told
                refused.append(type(e).__name__)
    x = np.full(4, comm.rank + 1.0)
    comm.allreduce(x)
    return float(x[0]), refused


def fails_on(comm: Any, bad: int) -> Any:
    """Rank ``bad`` raises ``ValueError("rank <bad>'s data is bad")``; the others enter an
    allreduce and wait there until its abort stops them."""
    import numpy as np

    if comm.rank == bad:
        raise ValueError(f"rank {bad}'s data is bad")
    x = np.ones(8)
    comm.allreduce(x)
    return x
