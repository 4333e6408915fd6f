"""Recursive doubling: the latency-optimal allreduce for small messages.

In round k every rank exchanges its whole buffer with the rank whose number differs in bit k
and reduces, so ``log2(size)`` rounds suffice (Thakur, Rabenseifner and Gropp 2005). For a
world size that is not a power of two, the first ``2 * rem`` ranks pair up beforehand: the
even one hands its data to the odd one and sits out, then gets the result at the end.
Reduction is commutative for every op pycoll offers, and ``a + b == b + a`` holds exactly in
floating point, so all ranks end with identical bits.
"""
from __future__ import annotations

import numpy as np

from .cost import Algorithm, Network, alpha, bound, fold_cost, gamma, lg, pof2
from .primitives import Peers, ReduceSpec, recv, send, sendrecv


def allreduce_recursive_doubling(peers: Peers, arr: np.ndarray, spec: ReduceSpec) -> None:
    n, r = peers.size, peers.rank
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2
    scratch = peers.scratch(arr.size, arr.dtype)
    # Fold the extra ranks into their partners.
    if r < 2 * rem:
        if r % 2 == 0:
            send(peers, r + 1, arr)
            vrank = -1
        else:
            recv(peers, r - 1, scratch)
            spec.reduce(arr, scratch)
            vrank = r // 2
    else:
        vrank = r - rem
    if vrank >= 0:
        mask = 1
        while mask < pof2:
            vpartner = vrank ^ mask
            partner = vpartner * 2 + 1 if vpartner < rem else vpartner + rem
            sendrecv(peers, partner, arr, partner, scratch)
            spec.reduce(arr, scratch)
            mask <<= 1
        spec.finish(arr)
    # Hand the result back to the ranks that sat out.
    if r < 2 * rem:
        if r % 2 == 0:
            recv(peers, r + 1, arr)
        else:
            send(peers, r - 1, arr)


def _allreduce_cost(nbytes: int, p: int, net: Network) -> float:
    """lg(q) whole-buffer exchanges among the q = pof2(p) ranks left after the fold."""
    link = net.link
    a, b, g = alpha(p, link, True), link.beta, gamma()
    q = pof2(p)
    folding = fold_cost(nbytes, p, link)
    per_rank = lg(q) * nbytes * (b + g)
    return bound(lg(q) * a + per_rank + folding, q * per_rank + folding, p, link)


ALLREDUCE = Algorithm("allreduce", "recursive_doubling", allreduce_recursive_doubling,
                      _allreduce_cost)
