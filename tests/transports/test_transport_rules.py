"""Pure rules of the transports, on any machine: NCCL-style device lists (PYCOLL_IB_HCA,
PYCOLL_SOCKET_IFNAME) and the stripe plan (both ends of a striped message, over verbs queue
pairs or tcp sockets, compute it from the size alone, so it must cover every byte exactly
once, in at most the lanes there are)."""
from __future__ import annotations

import socket

import pytest

from pycoll.errors import InvalidArgument, TransportError
from pycoll.transports.base import STRIPE_MIN, stripes
from pycoll.transports.netif import parse_name_rules, select_interface


def test_hca_list_prefix_exact_exclude_and_ports():
    rules = parse_name_rules("PYCOLL_IB_HCA", "mlx5_0:1,mlx5_1", ports=True)
    assert rules.admits("mlx5_0", 1) and not rules.admits("mlx5_0", 2)
    assert rules.admits("mlx5_1", 2) and rules.admits("mlx5_10", 1)   # a prefix
    rules = parse_name_rules("PYCOLL_IB_HCA", "=mlx5_1", ports=True)
    assert rules.admits("mlx5_1", 1) and not rules.admits("mlx5_10", 1)
    rules = parse_name_rules("PYCOLL_IB_HCA", "^rxe0", ports=True)
    assert not rules.admits("rxe0", 1) and rules.admits("mlx5_0", 1)
    assert parse_name_rules("PYCOLL_IB_HCA", "", ports=True).admits("anything", 3)
    with pytest.raises(InvalidArgument, match="bad port"):
        parse_name_rules("PYCOLL_IB_HCA", "mlx5_0:one", ports=True)


def test_interface_rules_like_nccl():
    rules = parse_name_rules("PYCOLL_SOCKET_IFNAME", "^lo,docker")
    assert not rules.admits("lo") and not rules.admits("docker0") and rules.admits("eth0")
    rules = parse_name_rules("PYCOLL_SOCKET_IFNAME", "^=eth0")
    assert not rules.admits("eth0") and rules.admits("eth01")
    assert parse_name_rules("PYCOLL_SOCKET_IFNAME", "eth,ens").admits("ens5")
    assert not parse_name_rules("PYCOLL_SOCKET_IFNAME", "=eth").admits("eth0")
    with pytest.raises(InvalidArgument, match="names nothing"):
        parse_name_rules("PYCOLL_SOCKET_IFNAME", "^,")


def test_select_interface_on_this_host():
    """Real interfaces of this machine: loopback by prefix and exactly, in both families;
    an exclusion of everything, or a name that is not there, is an error naming them."""
    assert select_interface("lo", socket.AF_INET) == ("lo", "127.0.0.1")
    assert select_interface("=lo", socket.AF_INET6) == ("lo", "::1")
    everything = ",".join(name for _, name in socket.if_nameindex())
    with pytest.raises(TransportError, match="admits none of this host's interfaces"):
        select_interface("^" + everything, socket.AF_INET)
    with pytest.raises(TransportError, match="no usable interface"):
        select_interface("=no-such-if0", socket.AF_INET)


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
