"""Choosing the network between hosts: NCCL-style interface lists
(``PYCOLL_SOCKET_IFNAME=^lo,docker``) and IPv6 end to end (store and data connections),
on namespace hosts that have both an IPv4 and an IPv6 (unique local) address on ``eth0``."""
from __future__ import annotations

import ipaddress

import pytest

from pycoll.testing.hosts import NamespaceHosts, available

from .jobs import _run_job

ok, why = available()
pytestmark = [pytest.mark.skipif(not ok, reason=why), pytest.mark.timeout(150)]


def _check(results: list[dict], per_host: int, family: int) -> set[str]:
    remotes: set[str] = set()
    for res in results:
        assert all(res[k] for k in ("allreduce", "broadcast", "allgather", "alltoall", "big"))
        assert res["host"] == f"pchost{res['rank'] // per_host}", res
        remotes |= set(res["remotes"])
    # every connection between hosts (store and data) used the family asked for
    between = {a for a in remotes if not ipaddress.ip_address(a).is_loopback}
    assert between and all(ipaddress.ip_address(a).version == family for a in between), remotes
    return between


def test_interface_exclusion_list_picks_the_hosts_network(tmp_path):
    """``^lo,docker``: everything but loopback and docker bridges, i.e. eth0 here."""
    with NamespaceHosts(2) as hosts:
        results = _run_job(hosts, 2, tmp_path, hosts.addresses[0],
                       PYCOLL_SOCKET_IFNAME="^lo,docker")
        between = _check(results, 2, 4)
        assert between <= set(hosts.addresses), between


def test_ipv6_between_hosts(tmp_path):
    """The master given as an IPv6 address: the store and every data connection between
    hosts use IPv6 (the interface chosen by prefix, ``eth``)."""
    with NamespaceHosts(2) as hosts:
        results = _run_job(hosts, 2, tmp_path, hosts.addresses6[0], PYCOLL_SOCKET_IFNAME="eth",
                       PYCOLL_TRANSPORTS="shm,tcp")
        between = _check(results, 2, 6)
        assert between <= set(hosts.addresses6), between
