"""``CallInfo``: the one description of a call, made once and read by every part that needs it.

A call is described once, when it has been planned (``comm/planning``: arguments checked, the
algorithm chosen), and that description travels with it:

* the message tag's 32-bit signature (``tags.signature``: ranks that disagree about a call
  put different signatures on their messages and in the fast path's slots);
* ``PYCOLL_DEBUG=DETAIL``'s fingerprint, compared across ranks through the store;
* the flight recorder's entry and its dump;
* the text of an error ("this rank called allreduce(dtype=float32, count=4, op=sum)").

The fast path makes one per kind of call (``fastpath.calls.FastCall.info``) and reuses it for
every call of that kind, so describing a call costs nothing on the hot path.
"""
from __future__ import annotations

from typing import Any

from ..tags import signature

#: point-to-point operations: only two ranks take part, so they have their own sequence
#: numbers, no signature in their tags and no DETAIL fingerprint
P2P = frozenset({"send", "recv", "batch_p2p"})
#: what DETAIL compares across ranks, in the order messages name them
FINGERPRINT_FIELDS = ("collective", "dtype", "count", "root", "op", "fold", "compress")
#: the calls whose ranks move different numbers of bytes (alltoall's splits; the uneven
#: rooted calls, whose agreed counts are in ``count``)
_BYTES_DIFFER = frozenset({"alltoall", "gatherv", "scatterv"})


class CallInfo:
    """What one call is: collective, bytes, dtype, element count, op, root and algorithm.

    ``dtype`` is pycoll's dtype name (``"bfloat16"`` too), ``count`` the elements per rank
    that every rank must agree on (a list for the coalesced calls; None where ranks may
    differ, as alltoall's splits), ``op`` a ``ReduceOp`` (None for calls without one) and
    ``root`` the root rank of rooted calls. ``algorithm`` is the name the selection chose
    (``"ring"``, ``"fastpath"``...), or None for point-to-point calls. ``fold`` says how a
    reduction folds when its order is fixed (docs/numerics.md): ``"dtype"`` or ``"fp32"``
    (rank order, accumulated in that type), None for its algorithm's own order; ranks must
    agree on it too, since the bits depend on it. ``compress``: the wire format of a
    compressed call (``"bf16"``, ``"fp16"``, ``"fp8"``, ``"int8"``), None for the buffer's
    own bytes; agreed likewise.
    """

    __slots__ = ("collective", "nbytes", "dtype", "count", "op", "root", "algorithm", "fold",
                 "compress", "_signature")

    def __init__(self, collective: str, nbytes: int, dtype: str | None = None,
                 count: Any = None, op: Any = None, root: int | None = None,
                 algorithm: str | None = None, fold: str | None = None,
                 compress: str | None = None) -> None:
        self.collective = collective
        self.nbytes = nbytes
        self.dtype = dtype
        self.count = count
        self.op = op
        self.root = root
        self.algorithm = algorithm
        self.fold = fold
        self.compress = compress
        self._signature: int | None = None

    @property
    def p2p(self) -> bool:
        return self.collective in P2P

    @property
    def agrees_apart(self) -> bool:
        """Whether the generic execution runs an agreement round beside the body
        (``algorithms.agreement``), because the body alone may let a rank return before it
        heard from every rank: a rooted call (its data flows one way), and a call whose
        agreed count is zero (its body moves nothing: a rank with an empty buffer would
        return at once, and a rank with data, waiting for it, would find it gone instead of
        learning that they disagree). Not calls whose ranks may move different amounts
        (alltoall's splits, allgatherv: ``count`` None), nor a barrier (its algorithm is
        the exchange)."""
        return self.root is not None or (self.nbytes == 0 and self.count is not None)

    @property
    def agreed(self) -> tuple:
        """(dtype, count, op, root), and the fold when the order is fixed: what every rank
        of a collective must agree on."""
        base: tuple = (self.dtype, self.count, self.op, self.root)
        if self.fold is not None:
            base += (self.fold,)
        return base if self.compress is None else base + ("compress", self.compress)

    def signature(self) -> int:
        """The 32 bits of the tag that say what this rank believes the call is (0 for
        point-to-point calls, whose ranks need not agree on anything but the size)."""
        sig = self._signature
        if sig is None:
            sig = self._signature = 0 if self.p2p else signature(self.collective, self.agreed)
        return sig

    def fields(self) -> dict[str, Any]:
        """dtype, count, op, root and algorithm, where set (the flight recorder's entry)."""
        out: dict[str, Any] = {}
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.count is not None:
            out["count"] = self.count
        if self.op is not None:
            out["op"] = str(self.op)
        if self.root is not None:
            out["root"] = int(self.root)
        if self.algorithm is not None:
            out["algorithm"] = self.algorithm
        if self.fold is not None:
            out["fold"] = self.fold
        if self.compress is not None:
            out["compress"] = self.compress
        return out

    def fingerprint(self) -> dict[str, Any]:
        """What DETAIL compares across ranks (bytes too, but for the calls whose blocks may
        differ per rank)."""
        fp: dict[str, Any] = {"collective": self.collective}
        if self.collective not in _BYTES_DIFFER:
            fp["nbytes"] = self.nbytes
            if self.count is not None:
                fp["count"] = self.count
        if self.dtype is not None:
            fp["dtype"] = self.dtype
        if self.op is not None:
            fp["op"] = str(self.op)
        if self.root is not None:
            fp["root"] = int(self.root)
        if self.fold is not None:
            fp["fold"] = self.fold
        if self.compress is not None:
            fp["compress"] = self.compress
        return fp

    def arguments(self) -> str:
        """``dtype=float32, count=4, op=sum``: the arguments ranks must agree on."""
        fp = self.fingerprint()
        return ", ".join(f"{f}={fp[f]}" for f in FINGERPRINT_FIELDS[1:] if f in fp)

    def __repr__(self) -> str:
        return f"<CallInfo {self.collective}({self.arguments()}) {self.nbytes} B>"
