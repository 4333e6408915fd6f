"""Pipelined chain broadcast: root -> root+1 -> ... -> root-1, segment by segment.

The buffer is cut into segments; a rank forwards segment k to its successor as soon as it
has arrived, while segment k+1 is still coming in, so after a start-up of p - 2 segments
every link is busy at once. Time (Thakur et al. 2005): (p - 2 + k)(alpha + n beta / k) for
k segments, so for large n it approaches n beta -- independent of p, where a binomial tree
pays log2 p whole-buffer transfers. This is NCCL's ring broadcast and Open MPI's
"pipeline" broadcast. Data lands in place: no scratch, no extra copy.

Each link is cut by the segment size of its own channel (``peers.segment_count``), which
both of its ends compute alike; a rank whose incoming and outgoing channels differ (shm in,
tcp out) forwards an outgoing segment once every byte of it has arrived.
"""
from __future__ import annotations

import math

import numpy as np

from .cost import Algorithm, Network, alpha, bound
from .primitives import Peers


def broadcast_pipeline(peers: Peers, arr: np.ndarray, root: int) -> None:
    n, r, size = peers.size, peers.rank, arr.size
    vrank = (r - root) % n
    succ = (r + 1) % n if vrank < n - 1 else None
    if vrank == 0:
        seg = peers.segment_count(succ, arr.itemsize)  # type: ignore[arg-type]
        peers.wait([peers.isend(succ, arr[i:i + seg]) for i in range(0, size, seg)])  # type: ignore[arg-type]
        return
    pred = (r - 1) % n
    seg_in = peers.segment_count(pred, arr.itemsize)
    # Post every receive up front: data lands in place, and the transport can deliver
    # segment k+1 while we forward segment k.
    arrivals = [(min(i + seg_in, size), peers.irecv(pred, arr[i:i + seg_in]))
                for i in range(0, size, seg_in)]
    if succ is None:
        peers.wait([req for _, req in arrivals])
        return
    seg_out = peers.segment_count(succ, arr.itemsize)
    sends, sent = [], 0
    for arrived, req in arrivals:
        peers.wait([req])
        while sent < size and min(sent + seg_out, size) <= arrived:
            stop = min(sent + seg_out, size)
            sends.append(peers.isend(succ, arr[sent:stop]))
            sent = stop
    peers.wait(sends)


def _cost(nbytes: int, p: int, net: Network) -> float:
    """(p - 2 + k)(alpha + n beta / k) for k segments of the largest segment size in use."""
    link = net.link
    a = alpha(p, link, True)
    k = max(1, math.ceil(nbytes / link.segment_bytes))
    return bound((p - 2 + k) * (a + nbytes / k * link.beta), (p - 1) * nbytes * link.beta, p,
                 link)


BROADCAST = Algorithm("broadcast", "pipeline", broadcast_pipeline, _cost)
