"""The verbs transport's pure rules, on any machine: PYCOLL_IB_HCA parsing and the stripe plan
(both ends of a rendezvous compute the plan from the size alone, so it must cover every byte
exactly once, in at most the queue pairs there are)."""
from __future__ import annotations

import pytest

from pycoll.errors import InvalidArgument
from pycoll.transports.verbs import STRIPE_MIN, stripes
from pycoll.transports.verbs_device import parse_hca


def test_hca_list_prefix_exact_exclude_and_ports():
    exclude, rules = parse_hca("mlx5_0:1,mlx5_1")
    assert not exclude
    assert rules[0].matches("mlx5_0", 1) and not rules[0].matches("mlx5_0", 2)
    assert rules[1].matches("mlx5_1", 2) and rules[1].matches("mlx5_10", 1)   # a prefix
    exclude, rules = parse_hca("=mlx5_1")
    assert rules[0].matches("mlx5_1", 1) and not rules[0].matches("mlx5_10", 1)
    exclude, rules = parse_hca("^rxe0")
    assert exclude and rules[0].matches("rxe0", 1)
    with pytest.raises(InvalidArgument, match="bad port"):
        parse_hca("mlx5_0:one")


@pytest.mark.parametrize("nqps", [1, 2, 4, 7])
@pytest.mark.parametrize("nbytes", [1, 4097, STRIPE_MIN - 1, STRIPE_MIN, 3 * STRIPE_MIN + 5,
                                    (8 << 20) + 3, 256 << 20])
def test_stripes_cover_every_byte_once(nbytes, nqps):
    plan = stripes(nbytes, nqps)
    assert 1 <= len(plan) <= nqps
    assert [q for q, _, _ in plan] == list(range(len(plan)))
    pos = 0
    for _, off, length in plan:
        assert off == pos and length > 0
        pos += length
    assert pos == nbytes
    if len(plan) > 1:
        assert min(length for _, _, length in plan) >= STRIPE_MIN // 2
