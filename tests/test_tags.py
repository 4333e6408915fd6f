"""Message tags: the call number, signature, communicator and collective they carry."""
from __future__ import annotations


def test_collective_tag_layout_round_trips():
    """The tag carries call number, signature, communicator and collective; a later call
    is never a conflict, the same call with another signature or an earlier call is."""
    from pycoll.tags import collective_tag, conflicts, describe_tag, signature, tag_low_bits
    low = tag_low_bits("allreduce", 7)
    sig = signature("allreduce", ("float32", 8, "sum", None))
    t = collective_tag(5, low, sig)
    assert describe_tag(t) == f"allreduce #5 (signature {sig:08x})"
    assert not conflicts(collective_tag(6, low, sig), t)          # a peer one call ahead
    assert conflicts(collective_tag(5, low, sig ^ 1), t)          # same call, other arguments
    assert conflicts(collective_tag(4, low, sig), t)              # an earlier call's leftover
    assert not conflicts(collective_tag(5, tag_low_bits("allreduce", 8), sig ^ 1), t)  # other comm
    assert collective_tag(6, low, sig) < t                        # later calls: more negative
    assert signature("allreduce", ("float32", 8, "sum", None)) == sig      # deterministic
