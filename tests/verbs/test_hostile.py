"""The verbs transport's setup port against hostile input (issue 32, part 5).

The setup port is the tcp listener each verbs rank opens (``wireup.Acceptor``, shared with
tcp): after the job-membership handshake it carries the queue-pair addresses
(``wire.QpAddresses``) and then only a farewell. Cases:

* strangers while a rank waits for its peer: garbage, a forged proof claiming rank 1, a proof
  replayed from another listener (an earlier job), a flood of silent connections: all are
  dropped and the job computes the right result;
* a peer of the job that lies in its queue-pair addresses (another magic, queue-pair count,
  ring size, MTU, a GID that is not text, queue pair numbers that do not exist): the pair
  fails with a clear error on both ranks, no hang, nothing written into the user's buffer.

The address parser (``wire.peer_addresses``) is plain Python and is tested here without a
device; the end-to-end cases need the Soft-RoCE VM (``bash tests/verbs/run_in_vm.sh``) and
skip elsewhere.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import numpy as np
import pytest

from pycoll.errors import TransportError
from pycoll.testing.strangers import HELLO
from pycoll.transports.verbs.wire import INFO, INFO_MAGIC, QpAddresses, peer_addresses

pytestmark = pytest.mark.timeout(240)

GID = b"fe80:0000:0000:0000:0000:0000:0000:0001"
GOOD = dict(magic=INFO_MAGIC, gid=GID, lid=0, psn=5, ring_slots=16, nqps=2, eager_max=65536,
            credit_rkey=1, credit_addr=4096, mtu=3, qpns=(17, 18))
LIES = {
    "magic": dict(magic=b"PCVERBS0"),
    "queue-pairs": dict(nqps=5, qpns=(1, 2, 3, 4, 5)),
    "eager-limit": dict(eager_max=1 << 30),
    "ring-size": dict(ring_slots=0),
    "huge-ring": dict(ring_slots=1 << 31),
    "mtu": dict(mtu=9),
    "gid": dict(gid=b"\xff\xfe" * 10),
}


def _addresses(**lies) -> bytes:
    return QpAddresses(**{**GOOD, **lies}).pack()


def test_peer_addresses_accepts_what_a_rank_sends():
    assert peer_addresses(_addresses(), 1, 2, 65536).qpns == (17, 18)


@pytest.mark.parametrize("lie", sorted(LIES))
def test_peer_addresses_refuses_a_lie(lie):
    with pytest.raises(TransportError, match="peer rank 3 sent") as info:
        peer_addresses(_addresses(**LIES[lie]), 3, 2, 65536)
    assert info.value.peer == 3


def test_peer_addresses_refuses_garbage():
    with pytest.raises(TransportError, match="peer rank 1"):
        peer_addresses(os.urandom(INFO.size), 1, 2, 65536)


# -- end to end, in the VM ----------------------------------------------------------------------
def _usable() -> tuple[bool, str]:
    try:
        from pycoll.transports.verbs.device import probe
    except Exception as e:  # noqa: BLE001
        return False, str(e)
    record, why = probe()
    return record is not None, why


needs_device = pytest.mark.skipif(not _usable()[0], reason=f"verbs is not usable here: "
                                  f"{_usable()[1]}; run tests/verbs/run_in_vm.sh")
VERBS = {"PYCOLL_TRANSPORTS": "verbs"}


def _setup_port(comm, rank):
    return json.loads(comm._store.get(f"pycoll/world//hello/{rank}"))["addr"]["verbs"]


def _strangers_job(comm):
    a = np.full(1 << 18, comm.rank + 1.0, dtype=np.float32)     # 1 MiB: rendezvous
    got_in: list[int] = []
    if comm.rank == 0:
        from pycoll.testing.strangers import knock
        addr = _setup_port(comm, 0)
        knocker = threading.Thread(target=lambda: got_in.append(
            knock((addr["host"], addr["port"]), seconds=10.0, connect_timeout=3.0)))
        knocker.start()
        comm.allreduce(a)
        knocker.join()
    else:
        time.sleep(2.0)                          # the strangers come first
        comm.allreduce(a)
    small = np.full(7, comm.rank + 1.0, dtype=np.float32)
    comm.allreduce(small)
    return float(a[0]), float(a[-1]), float(small[0]), comm.transport_summary(), got_in


@needs_device
def test_strangers_on_the_setup_port_are_dropped():
    from pycoll.testing import run_ranks
    out = run_ranks(_strangers_job, 2, env=VERBS, timeout=200, collective_timeout=120)
    for rank, (first, last, small, summary, _) in enumerate(out):
        assert (first, last, small, summary) == (3.0, 3.0, 3.0, "verbs"), out[rank]
    assert out[0][4] and out[0][4][0] >= 3, out[0][4]


def _liar_job(comm, lie):
    """Rank 1 first dials rank 0's setup port itself, proves it is rank 1 (it is), and sends
    lying queue-pair addresses; then it runs the allreduce as usual."""
    a = np.full(1 << 10, -7.0, dtype=np.float32)
    if comm.rank == 1:
        from pycoll.transports.wireup import MAGIC, proof
        verbs = comm._conn.transports["verbs"]
        addr = _setup_port(comm, 0)
        s = socket.create_connection((addr["host"], addr["port"]), timeout=30)
        s.sendall(HELLO.pack(MAGIC, 1, 0, 1, proof(verbs.token, addr["nonce"], 1, 0, 1)))
        assert s.recv(1) == b"\x01"
        if lie == "garbage":
            s.sendall(os.urandom(INFO.size))
        else:
            # a valid GID and MTU; the made-up queue pair numbers exist nowhere
            lies = LIES.get(lie, {"qpns": (0xFFFF0, 0xFFFF1)})
            s.sendall(_addresses(**{"gid": verbs.device.choice.gid.encode(),
                                    "mtu": verbs.device.choice.mtu, **lies}))
        time.sleep(0.5)
    try:
        comm.allreduce(a, timeout=30)
        got = ("ok", "")
    except Exception as e:  # noqa: BLE001
        got = (type(e).__name__, " ".join(str(e).split()))
    if comm.rank == 1:
        s.close()
    return got, bool((a == -7.0).all())


@needs_device
@pytest.mark.parametrize("lie", ["garbage", "queue-pairs", "ring-size", "gid",
                                 "made-up-queue-pairs"])
def test_peer_lying_about_its_queue_pairs(lie):
    """Rank 0 fails the pair naming rank 1 and what was wrong; rank 1 fails too (its own
    dial is refused, or it learns of rank 0's failure); no buffer was written. Made-up queue
    pair numbers cannot be told from a silent peer: rank 0 names rank 1 at its deadline."""
    from pycoll.testing import run_ranks
    out = run_ranks(_liar_job, 2, lie, env=VERBS, timeout=200, collective_timeout=120)
    (kind0, text0), untouched0 = out[0]
    (kind1, text1), untouched1 = out[1]
    assert kind1 != "ok", text1
    assert untouched0 and untouched1
    if lie == "made-up-queue-pairs":
        # nothing to check locally: queue pair numbers are the peer's to name. Rank 0 hears
        # nothing from them, and says so at the deadline, naming rank 1
        assert kind0 == "CollectiveTimeout" and "peer rank(s) [1]" in text0, text0
        return
    assert kind0 == "TransportError" and "peer rank 1 sent" in text0, text0
    assert "queue-pair addresses" in text0, text0


def _lying_grant_job(comm, lie):
    """Rank 1 receives a rendezvous message (1 MiB) but its clear-to-send lies: a wrong rkey,
    an address outside the buffer it registered, or another size."""
    a = np.full(1 << 18, -7.0, dtype=np.float32)
    if comm.rank == 1:
        from pycoll.transports.verbs.channel import VerbsChannel
        honest = VerbsChannel._grant

        def lying(self, req, send_id):
            honest(self, req, send_id)
            cts = self.pairs.outbox[-1]
            self.pairs.outbox[-1] = cts._replace(**{
                "rkey": dict(aux=cts.aux ^ 0x5A5A),
                "address": dict(addr=cts.addr + (1 << 32)),
                "size": dict(nbytes=cts.nbytes // 2)}[lie])

        VerbsChannel._grant = lying
    try:
        if comm.rank == 0:
            comm.send(np.full(1 << 18, 5.0, dtype=np.float32), 1, timeout=30)
        else:
            comm.recv(a, 0, timeout=30)
        got = ("ok", "")
    except Exception as e:  # noqa: BLE001
        got = (type(e).__name__, " ".join(str(e).split()))
    return got, bool((a == -7.0).all())


@needs_device
@pytest.mark.parametrize("lie", ["rkey", "address", "size"])
def test_peer_lying_in_its_clear_to_send(lie):
    """The sender's RDMA write is refused by the adapter (wrong rkey, address outside the
    region) or the grant is refused by the sender (another size): the sender fails naming
    the receiver, the receiver fails too, and nothing lands in the receiver's buffer."""
    from pycoll.testing import run_ranks
    out = run_ranks(_lying_grant_job, 2, lie, env=VERBS, timeout=200, collective_timeout=120)
    (kind0, text0), _ = out[0]
    (kind1, text1), untouched1 = out[1]
    assert kind0 != "ok" and "peer rank 1" in text0, text0
    if lie == "size":
        assert "granted an unknown message" in text0, text0
    assert kind1 != "ok", text1
    assert untouched1
