"""The RDMA device of the verbs transport: which one, its address, and registered memory.

* ``select_port()`` picks the device and port from ``PYCOLL_IB_HCA`` (NCCL_IB_HCA's syntax:
  ``mlx5_0:1,mlx5_1`` prefixes, ``=`` for exact names, a leading ``^`` to exclude) and the GID
  from ``PYCOLL_IB_GID_INDEX`` (default: the first RoCE v2 GID with an IPv4-mapped address,
  which is what routes between hosts on Ethernet; on InfiniBand the port's LID is used).
* ``probe()`` says whether verbs is usable here. A library must fall back on *any* of: pyverbs
  missing or built against another libibverbs (``ImportError``), no RDMA in the kernel
  (``get_device_list`` raises), no device, no active port (``docs/verbs.md``).
* ``Device`` holds the opened context and protection domain; ``create_qp`` and
  ``connect_qp`` make an RC queue pair and connect it to a peer's.
* ``RegistrationCache`` registers user buffers once and reuses the registration while the
  memory is unchanged: keyed on the exporting object's whole buffer (address range) and held
  through a weak reference to that object, so the registration goes when the object goes
  (memory freed and reused at the same address is registered afresh: a stale registration
  pins the old pages and would move stale bytes). Objects that cannot be weakly referenced
  (``bytes``, ``bytearray``) are registered for one message. Bounded in bytes and entries;
  the least recently used registration goes first.
"""
from __future__ import annotations

import ctypes
import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ...envvars import env_int
from ...errors import TransportError
from ..netif import parse_name_rules

#: pyverbs' enums module moved (rdma-core <= ~50: pyverbs.enums; later: libibverbs_enums)
try:
    import pyverbs.enums as E
except ImportError:  # pragma: no cover - depends on the installed rdma-core
    try:
        import pyverbs.libibverbs_enums as E
    except ImportError:
        E = None

LINK_ETHERNET = 2       # ibv_port_attr.link_layer: IBV_LINK_LAYER_ETHERNET
PORT_ACTIVE = 4         # IBV_PORT_ACTIVE
SYSFS = "/sys/class/infiniband"


def _gid_type(device: str, port: int, index: int) -> str:
    try:
        with open(f"{SYSFS}/{device}/ports/{port}/gid_attrs/types/{index}") as f:
            return f.read().strip()
    except OSError:
        return ""


def _gid_is_set(gid: str) -> bool:
    return gid.replace(":", "").strip("0") != ""


def _default_gid_index(ctx: Any, device: str, port: int, table_len: int) -> int:
    """The first RoCE v2 GID holding an IPv4-mapped address, else any RoCE v2, else 0."""
    fallback = None
    for index in range(min(table_len, 64)):
        try:
            gid = str(ctx.query_gid(port, index))
        except Exception:   # noqa: BLE001 - an unset entry
            continue
        if not _gid_is_set(gid) or _gid_type(device, port, index) != "RoCE v2":
            continue
        if gid.startswith("0000:0000:0000:0000:0000:ffff:"):
            return index
        fallback = index if fallback is None else fallback
    return 0 if fallback is None else fallback


@dataclass(frozen=True)
class PortChoice:
    device: str
    port: int
    gid_index: int
    gid: str
    lid: int
    ethernet: bool
    mtu: int            # the active MTU as an ibv_mtu enum value


def select_port() -> PortChoice:
    """The device/port/GID this rank uses, or ``TransportError`` saying why none."""
    if E is None:
        raise TransportError("pyverbs is not installed for this Python (install Debian's "
                             "python3-pyverbs and use a venv with --system-site-packages)")
    from pyverbs.device import Context, get_device_list
    from pyverbs.pyverbs_error import PyverbsError

    try:
        names = [d.name.decode() for d in get_device_list()]
    except PyverbsError as e:
        raise TransportError(f"no RDMA support in this kernel ({e})") from None
    if not names:
        raise TransportError("no RDMA device (ibv_devices lists none)")
    spec = os.environ.get("PYCOLL_IB_HCA", "")
    rules = parse_name_rules("PYCOLL_IB_HCA", spec, ports=True)
    gid_env = os.environ.get("PYCOLL_IB_GID_INDEX", "").strip()
    seen = []
    for name in sorted(names):
        try:
            ctx = Context(name=name)
        except PyverbsError as e:
            seen.append(f"{name}: cannot open ({e})")
            continue
        try:
            nports = ctx.query_device().phys_port_cnt
            for port in range(1, nports + 1):
                if not rules.admits(name, port):
                    continue
                attr = ctx.query_port(port)
                if attr.state != PORT_ACTIVE:
                    seen.append(f"{name}:{port} is not active")
                    continue
                ethernet = attr.link_layer == LINK_ETHERNET
                if gid_env:
                    index = int(gid_env)
                elif ethernet:
                    index = _default_gid_index(ctx, name, port, attr.gid_tbl_len)
                else:
                    index = 0
                gid = str(ctx.query_gid(port, index))
                if ethernet and not _gid_is_set(gid):
                    seen.append(f"{name}:{port} has no GID at index {index}")
                    continue
                return PortChoice(name, port, index, gid, attr.lid, ethernet, attr.active_mtu)
        finally:
            ctx.close()
    why = "; ".join(seen) or f"devices {', '.join(names)} are all excluded"
    raise TransportError(f"no usable RDMA port (PYCOLL_IB_HCA={spec!r}): {why}")


def probe() -> tuple[dict[str, Any] | None, str]:
    try:
        choice = select_port()
    except ImportError as e:
        return None, f"pyverbs cannot be imported ({e})"
    except TransportError as e:
        return None, str(e)
    except Exception as e:   # noqa: BLE001 - any device oddity means: not usable here
        return None, f"RDMA device query failed: {type(e).__name__}: {e}"
    # Two ranks can talk over verbs when their ports sit on one fabric: RoCE routes over IP
    # (every RoCE port is one fabric), InfiniBand within a subnet (the GID's prefix).
    fabric = "roce" if choice.ethernet else "ib:" + choice.gid[:19]
    fabric = os.environ.get("PYCOLL_IB_FABRIC", fabric)
    return {"fabric": fabric, "device": f"{choice.device}:{choice.port}"}, ""


class Device:
    """The opened device: context, protection domain, and the port's address."""

    def __init__(self) -> None:
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.choice = select_port()
        self.ctx = Context(name=self.choice.device)
        self.pd = PD(self.ctx)

    def comp_channel(self) -> tuple[Any, int]:
        """A completion channel and its (non-blocking) descriptor. pyverbs does not expose
        the descriptor, so it is found as the one ``[infinibandevent]`` descriptor that
        creating the channel added to this process."""
        import fcntl

        from pyverbs.cq import CompChannel

        before = _event_fds()
        cc = CompChannel(self.ctx)
        new = _event_fds() - before
        if len(new) != 1:
            cc.close()
            raise TransportError("verbs: cannot find the completion channel's descriptor")
        fd = new.pop()
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        return cc, fd

    def close(self) -> None:
        for obj in (self.pd, self.ctx):
            try:
                obj.close()
            except Exception:   # noqa: BLE001 - teardown must not fail
                pass


def _event_fds() -> set[int]:
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if "infinibandevent" in os.readlink(f"/proc/self/fd/{name}"):
                out.add(int(name))
        except OSError:
            continue
    return out


def create_qp(dev: Device, cq: Any, max_send: int, max_recv: int, inline: int) -> tuple[Any, int]:
    """An RC queue pair on ``cq``, moved to INIT (receives can be posted from then on);
    returns it and the inline size it accepted (``inline``, or 0 where refused)."""
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

    for size in (inline, 0):
        cap = QPCap(max_send_wr=max_send, max_recv_wr=max_recv, max_send_sge=1, max_recv_sge=1,
                    max_inline_data=size)
        try:
            # sq_sig_all=0 (pyverbs defaults to 1): a work request completes into the CQ
            # only if it asks to (``IBV_SEND_SIGNALED``), so most control messages need no
            # completion polled (queue_pairs: selective signaling)
            qp = QP(dev.pd, QPInitAttr(qp_type=E.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap,
                                       sq_sig_all=0))
            break
        except Exception:   # noqa: BLE001 - retry without inline data
            if size == 0:
                raise
    attr = QPAttr(port_num=dev.choice.port)
    attr.qp_access_flags = qp_access_flags()
    attr.pkey_index = 0
    qp.to_init(attr)
    return qp, size


def connect_qp(qp: Any, port: PortChoice, gid: str, lid: int, qpn: int, psn: int, sq_psn: int,
               mtu: int, ack_timeout: int, retry_cnt: int) -> None:
    """INIT -> RTR -> RTS towards the peer's queue pair ``qpn``: RoCE needs a global route
    (GID, no LIDs), InfiniBand a LID. ``rnr_retry`` 7 (no limit) is safe because credits
    keep every send within posted receives; a silent peer is caught by the ack timeout."""
    from pyverbs.addr import GID, AHAttr, GlobalRoute
    from pyverbs.qp import QPAttr

    attr = QPAttr(port_num=port.port)
    attr.qp_access_flags = qp_access_flags()
    attr.pkey_index = 0
    attr.path_mtu = mtu
    attr.dest_qp_num = qpn
    attr.rq_psn = psn
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    if port.ethernet:
        gr = GlobalRoute(dgid=GID(gid), sgid_index=port.gid_index, hop_limit=64)
        attr.ah_attr = AHAttr(is_global=1, port_num=port.port, gr=gr)
    else:
        attr.ah_attr = AHAttr(is_global=0, port_num=port.port, dlid=lid)
    attr.timeout = ack_timeout
    attr.retry_cnt = retry_cnt
    attr.rnr_retry = 7
    attr.sq_psn = sq_psn
    attr.max_rd_atomic = 1
    qp.to_rts(attr)


def qp_access_flags() -> int:
    """What a queue pair lets its peer do: RDMA writes and reads, and atomics (a window's
    signal is a fetch-and-add; only memory registered with ``REMOTE_ATOMIC`` accepts one)."""
    return access_flags(True) | E.IBV_ACCESS_REMOTE_ATOMIC


def access_flags(remote: bool) -> int:
    flags = E.IBV_ACCESS_LOCAL_WRITE
    if remote:
        flags |= E.IBV_ACCESS_REMOTE_WRITE | E.IBV_ACCESS_REMOTE_READ
    return flags


def _address(view: memoryview) -> int:
    if not view.nbytes:
        return 0
    if view.readonly:
        import numpy as np
        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def exporter_range(view: memoryview) -> tuple[Any, int, int, int]:
    """(owner, address, length, address of ``view``): the whole buffer ``view`` is part of,
    the unit a registration covers, so every slice of one tensor hits one registration. The
    owner is the object at the end of numpy's ``base`` chain (a torch tensor, the array that
    allocated the memory, a bytearray): it lives as long as the memory does."""
    import numpy as np

    at = _address(view)
    obj: Any = view.obj
    root = None
    while isinstance(obj, np.ndarray):
        root = obj
        if obj.base is None:
            break
        obj = obj.base
    try:
        whole = (root.data if root is not None else memoryview(obj)).cast("B")
        base = _address(whole)
        if not base <= at <= base + whole.nbytes - view.nbytes:
            raise ValueError("view outside its exporter")
    except (TypeError, ValueError):
        return view.obj, at, view.nbytes, at
    return obj, base, whole.nbytes, at


class Registration:
    """One memory region: the ``MR`` and the range it covers. ``users`` counts the
    operations using it (``RegistrationCache.register`` / ``release``); it is closed only
    once nobody uses it and the cache no longer holds it."""

    __slots__ = ("mr", "addr", "nbytes", "lkey", "rkey", "cached", "users", "__weakref__")

    def __init__(self, mr: Any, addr: int, nbytes: int, cached: bool) -> None:
        self.mr = mr
        self.addr = addr
        self.nbytes = nbytes
        self.lkey = mr.lkey
        self.rkey = mr.rkey
        self.cached = cached      # held by the cache (False: evicted, or never cached)
        self.users = 0

    def close(self) -> None:
        try:
            self.mr.close()
        except Exception:   # noqa: BLE001 - teardown must not fail
            pass


class RegistrationCache:
    """Registered user memory, reused while its owner lives (see the module docstring).

    Every ``register`` is paired with a ``release`` once the operation completed or failed:
    a registration in use is never closed (eviction skips it; one evicted while in use is
    closed by its last ``release``). A buffer larger than the whole budget is registered for
    its operation only. Writable memory is registered for remote writes too (a receive
    buffer); read-only memory (a ``bytes`` send source) with no access rights, under a key
    of its own.
    """

    def __init__(self, pd: Any) -> None:
        from pyverbs.mr import MR

        self._pd = pd
        self._mr = MR
        self.max_bytes = env_int("PYCOLL_IB_REG_CACHE_BYTES", 4 << 30, minimum=0)
        self.max_entries = env_int("PYCOLL_IB_REG_CACHE_ENTRIES", 1024, minimum=0)
        self._entries: OrderedDict[tuple[int, int, int, bool], tuple[Registration, Any]] = \
            OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def register(self, view: memoryview) -> tuple[Registration, int]:
        """(registration covering ``view``, ``view``'s address); ``release`` it after use."""
        owner, addr, nbytes, at = exporter_range(view)
        writable = not view.readonly
        key = (addr, nbytes, id(owner), writable)
        found = self._entries.get(key)
        if found is not None and found[1]() is owner:
            self._entries.move_to_end(key)
            self.hits += 1
            found[0].users += 1
            return found[0], at
        self.misses += 1
        try:
            ref = weakref.ref(owner)
        except TypeError:
            ref = None
        try:
            mr = self._mr(self._pd, max(nbytes, 1), access_flags(True) if writable else 0,
                          address=addr or None)
        except Exception as e:   # noqa: BLE001 - pinning limits, bad address...
            raise TransportError(
                f"verbs: cannot register {nbytes} bytes of memory ({e}); raise the locked-memory "
                "limit (ulimit -l) or lower PYCOLL_IB_REG_CACHE_BYTES") from None
        cache = ref is not None and self.max_entries > 0 and nbytes <= self.max_bytes
        reg = Registration(mr, addr, nbytes, cached=cache)
        reg.users = 1
        if not cache:
            return reg, at
        if found is not None:
            self._drop(key)
        self._entries[key] = (reg, ref)
        self._bytes += nbytes
        weakref.finalize(owner, self._forget, key, weakref.ref(reg))
        self._evict()
        return reg, at

    def release(self, reg: Registration) -> None:
        reg.users -= 1
        if reg.users <= 0 and not reg.cached:
            reg.close()

    def _evict(self) -> None:
        for key in list(self._entries):
            if self._bytes <= self.max_bytes and len(self._entries) <= self.max_entries:
                return
            if self._entries[key][0].users == 0:
                self._drop(key)

    def _forget(self, key: tuple[int, int, int, bool], reg_ref: Any) -> None:
        found = self._entries.get(key)
        if found is not None and found[0] is reg_ref():
            self._drop(key)

    def _drop(self, key: tuple[int, int, int, bool]) -> None:
        reg, _ = self._entries.pop(key)
        self._bytes -= reg.nbytes
        reg.cached = False
        if reg.users <= 0:
            reg.close()

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._entries),
                "bytes": self._bytes}

    def close(self) -> None:
        while self._entries:
            reg, _ = self._entries.popitem()[1]
            reg.close()
        self._bytes = 0
