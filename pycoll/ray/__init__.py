"""Ray: run a pycoll job as ``n`` Ray actors, one rank each (``pycoll.ray.run(fn, n)``).

Ray already starts processes on the cluster's nodes, so a pycoll job needs no launcher there:
``run`` reserves a placement group of ``n`` bundles (Ray places all of them or none, which a
job of ranks that wait for each other needs), starts one actor per bundle (rank = bundle
index), bootstraps pycoll between the actors, runs ``fn(comm, *args, **kwargs)`` in each and
returns the results ordered by rank. The actors and the placement group are removed at the
end, always: after success, an error, a timeout or a KeyboardInterrupt on the driver.

The bootstrap is the MPI one (``pycoll.launch.mpi``) over Ray's actor calls instead of an MPI
communicator: rank 0's actor is the meeting point of the bootstrap's allgathers (the other
actors call its ``gather`` method; its own rank hands in directly). Rank 0 starts the job's
store on its node's address as Ray names it (``ray.util.get_node_ip_address()``; on one host
on loopback), draws the job secret, and the other ranks learn "address, port, secret" as the
return value of that call. The secret so travels only over Ray's own RPC between the actors:
never on a command line, in an environment, or through the driver.

A rank whose ``fn`` raises posts an abort (the others' collectives stop at once naming it);
an actor that dies is seen by Ray (``RayActorError``) and by its peers (``PeerLost``). The
driver raises :class:`RayRankFailed` naming the rank that failed first, its node and why, and
kills every actor of the job.
"""
from __future__ import annotations

from .driver import STRATEGIES, RayJobTimeout, RayRankFailed, run

__all__ = ["run", "RayRankFailed", "RayJobTimeout", "STRATEGIES"]
