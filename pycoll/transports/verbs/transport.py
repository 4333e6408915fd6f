"""The verbs transport: RDMA over InfiniBand or RoCE through pyverbs, for ranks on any host
whose ports share a fabric.

One per rank: it opens the device (``device.py``), registers the memory every channel shares
(the credit words peers write into, a scratch word), sets up each pair's channel over the
same lazy dials and handshake as tcp (``wireup.Connector``), and blocks the progress engine
on the channels' completion channels and setup sockets. The protocol is the channel's
(``channel.py``), the queue pairs its ``QueuePairs`` (``queue_pairs.py``), the layouts on
the wire ``wire.py``'s.
"""
from __future__ import annotations

import os
import select
from typing import Any

import numpy as np

from ...buffers.memory import MemRef
from ...envvars import env_int
from ...errors import TransportError
from ..base import ActiveSet, Capabilities, OpenContext, PeerInfo, Transport
from ..netif import choose_bind_address
from ..wireup import Connector, ConnectorTransport
from .channel import VerbsChannel
from .device import (
    Device,
    RegistrationCache,
    access_flags,
    exporter_range,
    probe,
    qp_access_flags,
)
from .window import CONTROL_WORDS, VerbsExposedWindow
from .wire import EAGER_MAX, INLINE_BYTES, MAX_QPS


class VerbsTransport(ConnectorTransport, Transport):
    """RDMA over InfiniBand or RoCE through pyverbs (see the module docstring)."""

    name = "verbs"
    capabilities = Capabilities("verbs", latency_us=3.0, bandwidth_gbps=12.0,
                                same_host_only=False, one_sided=True, segment_bytes=1 << 20,
                                windows=True)

    def __init__(self, ctx: OpenContext) -> None:
        self.rank = ctx.rank
        self.size = ctx.size
        self.token = ctx.token
        self.eager_max = env_int("PYCOLL_IB_EAGER_MAX", EAGER_MAX, minimum=0)
        self.qps_per_peer = env_int("PYCOLL_IB_QPS_PER_PEER", 1, minimum=1)
        if self.qps_per_peer > MAX_QPS - 1:
            raise TransportError(f"PYCOLL_IB_QPS_PER_PEER={self.qps_per_peer}: at most "
                                 f"{MAX_QPS - 1}")
        self.ring_slots = env_int("PYCOLL_IB_EAGER_SLOTS", 16, minimum=2)   # and send slots
        self.ack_timeout = env_int("PYCOLL_IB_TIMEOUT", 14, minimum=1)
        self.retry_cnt = min(7, env_int("PYCOLL_IB_RETRY_CNT", 7, minimum=1))
        self.inline = INLINE_BYTES
        self.device = Device()
        self.cache = RegistrationCache(self.device.pd)
        # credit words: the peers write theirs into ``credit_words`` (one per rank); this
        # rank writes from ``credit_out``
        self.credit_words = np.zeros(self.size, dtype=np.uint64)
        self.credit_mr = self.register_own(self.credit_words)
        self.credit_addr = self.credit_mr.buf
        self.credit_out = np.zeros(self.size, dtype=np.uint64)
        self.credit_out_mr = self.register_own(self.credit_out)
        self.credit_out_addr = self.credit_out_mr.buf
        self._scratch = np.zeros(64, dtype=np.uint8)
        self.scratch_mr = self.register_own(self._scratch)
        self.notices: list[tuple[int, int]] = []
        self._exposed: dict[int, tuple[Any, MemRef]] = {}
        #: open windows by id (``window.py``); while there are any, every pair stays active
        self.windows: dict[int, Any] = {}
        self._windows_made = 0
        #: every window's control words and their registration (``expose_window``)
        self._window_controls: list[tuple[Any, np.ndarray]] = []
        host, family = choose_bind_address(ctx.master_addr)
        self._setup = Connector(self, ctx.size, ctx.accepts, host, family,
                                lambda peer, streams: VerbsChannel(self, peer))
        self._channels: dict[int, VerbsChannel] = self._setup.channels
        self.active = ActiveSet()
        self.exchanging = 0
        self._kick_fd = os.eventfd(0, os.EFD_NONBLOCK)
        self._kicked = False

    def register_own(self, array: np.ndarray) -> Any:
        """Register memory this transport owns (rings, slots, credit words)."""
        from pyverbs.mr import MR

        return MR(self.device.pd, array.nbytes, access_flags(True), address=array.ctypes.data)

    # -- registry ------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> tuple[dict[str, Any] | None, str]:
        return probe()

    @staticmethod
    def can_connect(a: PeerInfo, b: PeerInfo) -> bool:
        return a.records["verbs"]["fabric"] == b.records["verbs"]["fabric"]

    # -- progress --------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = self._setup.progress(self.active.channels.values())
        if self._kicked:
            self._kicked = False
            try:
                os.eventfd_read(self._kick_fd)
            except BlockingIOError:
                pass
        if self.active.channels:
            moved = self.active.progress() or moved
        self.setup_pending = self._setup.pending or bool(self.exchanging)
        return moved

    def wait_fds(self) -> list[tuple[int, int]] | None:
        fds = self._setup.fds()
        slipped = False
        for ch in self._working():
            fds += ch.pairs.fds()
            slipped = ch.pairs.arm() or slipped
        if slipped and not self._kicked:      # a completion came while arming: wake at once
            os.eventfd_write(self._kick_fd, 1)
            self._kicked = True
        fds.append((self._kick_fd, select.EPOLLIN))
        return fds

    def _working(self) -> list[VerbsChannel]:
        return list(self.active.channels.values())  # type: ignore[arg-type]

    # -- one-sided ---------------------------------------------------------------------------
    def register(self, mem: MemRef) -> dict[str, Any]:
        from pyverbs.mr import MR

        _owner, _base, _n, at = exporter_range(mem.view)
        mr = MR(self.device.pd, max(mem.nbytes, 1), access_flags(True), address=at or None)
        self._exposed[mr.rkey] = (mr, mem)
        return {"addr": at, "rkey": mr.rkey, "nbytes": mem.nbytes}

    def expose_window(self, mem: MemRef, dtype: str = "", np_dtype: Any = None
                      ) -> VerbsExposedWindow:
        """Register the window's memory for peers' RDMA reads and writes (``window.py``)."""
        from pyverbs.mr import MR

        _owner, _base, _n, at = exporter_range(mem.view)
        # 8-byte aligned, as atomics need
        control = np.zeros(CONTROL_WORDS, dtype=np.uint64)
        mrs: list[Any] = []
        try:
            mrs.append(MR(self.device.pd, max(mem.nbytes, 1), access_flags(True),
                          address=at or None))
            mrs.append(MR(self.device.pd, control.nbytes, qp_access_flags(),
                          address=control.ctypes.data))
        except Exception as e:   # noqa: BLE001 - pinning limits, bad address...
            for mr in mrs:
                mr.close()
            raise TransportError(f"verbs: cannot register the window's {mem.nbytes} bytes ({e}); "
                                 "raise the locked-memory limit (ulimit -l)") from None
        self._windows_made += 1
        wid = self._windows_made
        win = self.windows[wid] = VerbsExposedWindow(wid, mem.view, self.rank, dtype, np_dtype,
                                                     self.windows, mrs[0], at, control, mrs[1])
        # registered until the transport closes: a late origin reads the closed word there
        # (window.py) instead of breaking the pair on a deregistered region
        self._window_controls.append((mrs[1], control))
        for ch in self._channels.values():      # requests arrive unasked: poll every pair
            if ch.broken is None:
                self.active.channels[ch.peer] = ch
        return win

    def deregister(self, record: dict[str, Any]) -> None:
        found = self._exposed.pop(int(record["rkey"]), None)
        if found is not None:
            found[0].close()

    def notifications(self) -> list[tuple[int, int]]:
        for ch in self._channels.values():
            ch.progress()           # nothing to do on a channel still connecting
        notices, self.notices = self.notices, []
        return notices

    def held_memory(self) -> dict[str, int]:
        """Registered: this transport's own words, every channel's rings and send slots, the
        registration cache and the regions exposed to puts."""
        own = self.credit_words.nbytes + self.credit_out.nbytes + self._scratch.nbytes
        rings = sum(ch.pairs.registered_bytes() for ch in self._channels.values())
        exposed = sum(mem.nbytes for _, mem in self._exposed.values())
        return {"segment": 0,
                "registered": own + rings + exposed + int(self.cache.stats()["bytes"])}

    def stats(self) -> dict[str, Any]:
        """Registration cache counters (the bench reports them)."""
        return self.cache.stats()

    def close(self) -> None:
        for win in list(self.windows.values()):     # their registrations go before the PD
            win.close()
        controls, self._window_controls = self._window_controls, []
        for mr, _ in controls:
            try:
                mr.close()
            except Exception:   # noqa: BLE001
                pass
        self._setup.close()
        self.active.channels.clear()
        for mr, _ in self._exposed.values():
            try:
                mr.close()
            except Exception:   # noqa: BLE001
                pass
        self._exposed.clear()
        self.cache.close()
        for mr in (self.credit_mr, self.credit_out_mr, self.scratch_mr):
            try:
                mr.close()
            except Exception:   # noqa: BLE001
                pass
        os.close(self._kick_fd)
        self.device.close()
