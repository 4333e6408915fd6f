"""Bootstrap from an MPI communicator (mpi4py): no MASTER_ADDR needed across hosts.

MPI launchers (mpiexec of MPICH or Open MPI) do not say where rank 0 runs, but their ranks can
already talk: rank 0 starts the job's store on an address the others can reach, draws the
job secret, and broadcasts (address, port, secret) over the communicator, as DeepSpeed's
``mpi_discovery`` and Horovod's ``init(comm=)`` do. ``pycoll.init(comm=MPI.COMM_WORLD)`` uses
it explicitly; plain ``pycoll.init()`` uses it by itself under an MPI launcher on several
hosts without MASTER_ADDR, when mpi4py is installed.
"""
from __future__ import annotations

import os
import secrets
import socket
from typing import TYPE_CHECKING, Any

from ..errors import PycollError

if TYPE_CHECKING:
    from rendezvous import TCPStore


class GatherComm:
    """The two MPI calls ``bootstrap`` makes (``allgather``, ``bcast``), for ranks whose
    framework offers only an allgather between them: Spark's barrier tasks
    (``BarrierTaskContext.allGather``), Ray's actors (rank 0's actor as the meeting point).
    A subclass implements ``allgather``; ``bcast`` is one allgather, read at the root."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank = rank
        self._size = size

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self._rank

    def Get_size(self) -> int:  # noqa: N802
        return self._size

    def allgather(self, obj: Any) -> list[Any]:
        raise NotImplementedError

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.allgather(obj if self._rank == root else None)[root]


def reachable_address(hostnames: list[str]) -> str:
    """An address of this host that the hosts in ``hostnames`` can reach: the one the tcp
    transport would bind toward another host (the route's source address, or
    ``PYCOLL_SOCKET_IFNAME``'s), since the host's own name may resolve to 127.0.1.1."""
    from ..transports.netif import choose_bind_address

    me = socket.gethostname()
    for name in hostnames:
        if name != me:
            try:
                return choose_bind_address(name)[0]
            except OSError:
                continue
    return socket.gethostbyname(me)


def bootstrap(comm: Any, timeout: float) -> tuple[int, int, TCPStore, str, str]:
    """(rank, size, store client, secret, store address) for the ranks of ``comm``."""
    from rendezvous import TCPStore

    rank, size = comm.Get_rank(), comm.Get_size()
    hostnames = comm.allgather(socket.gethostname())
    offer: Any = None
    store = None
    if rank == 0:
        try:
            addr = ("127.0.0.1" if len(set(hostnames)) == 1
                    else os.environ.get("PYCOLL_MASTER_ADDR") or reachable_address(hostnames))
            token = os.environ.get("PYCOLL_TOKEN") or secrets.token_hex(16)
            port = int(os.environ.get("PYCOLL_MASTER_PORT", "0") or 0)
            store = TCPStore(addr, port, is_server=True, token=token, timeout=timeout)
            offer = ("ok", addr, store.port, token)
        except Exception as e:  # noqa: BLE001 - tell the other ranks instead of hanging them
            offer = ("error", f"{type(e).__name__}: {e}")
    offer = comm.bcast(offer, root=0)
    try:
        addr, port, token = _accept_offer(offer, rank)
    except PycollError:
        if store is not None:
            store.close()
        raise
    if store is None:                         # every rank but 0, which made it above
        store = TCPStore(addr, port, token=token, timeout=timeout)
    return rank, size, store, token, addr


def _accept_offer(offer: Any, rank: int) -> tuple[str, int, str]:
    """(address, port, secret) from rank 0's broadcast, or a clear error: rank 0's own
    failure, or a message of another shape (another pycoll version on rank 0, or something
    else speaking on the channel). The secret is never echoed into the error."""
    if isinstance(offer, (list, tuple)) and len(offer) == 2 and offer[0] == "error":
        raise PycollError(f"rank {rank}: bootstrap over MPI failed on rank 0: {offer[1]}")
    if (isinstance(offer, (list, tuple)) and len(offer) == 4 and offer[0] == "ok"
            and isinstance(offer[1], str) and isinstance(offer[2], int)
            and not isinstance(offer[2], bool) and 0 < offer[2] < 65536
            and isinstance(offer[3], str) and offer[3]):
        return offer[1], offer[2], offer[3]
    shape = (f"{type(offer).__name__} of {len(offer)}" if isinstance(offer, (list, tuple))
             else type(offer).__name__)
    raise PycollError(f"rank {rank}: bootstrap: rank 0's broadcast of the store's address is "
                      f"not one (a {shape}, expected ('ok', address, port, secret)): do all "
                      "ranks run the same pycoll version?")


def should_bootstrap(launcher: str, env: Any, master_addr: str | None) -> bool:
    """Plain ``init()`` under an MPI launcher on several hosts, without an address given;
    under a PMIx launcher always (its environment has no world size), if mpi4py is there."""
    import importlib.util
    if launcher == "pmix":
        return importlib.util.find_spec("mpi4py") is not None
    if launcher not in ("openmpi", "mpich") or master_addr is not None:
        return False
    if env.get("PYCOLL_MASTER_ADDR") or env.get("MASTER_ADDR"):
        return False
    local = env.get("OMPI_COMM_WORLD_LOCAL_SIZE") or env.get("MPI_LOCALNRANKS")
    size = env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE")
    if local is not None and local == size:
        return False                          # one host: loopback needs no discovery
    return importlib.util.find_spec("mpi4py") is not None
