"""``CudaIpcChannel``: an shm channel with one more message kind, device memory (see the
package's docstring for the protocol)."""
from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

import numpy as np

from ...buffers.memory import view_address
from ...errors import TransportError
from ..base import Request
from ..shm.channel import ShmChannel, ShmOwner
from ..shm.segment import FIRST_EXTENSION_KIND, SLOT_HEADER, Segment
from ..shm.window import check_path
from ..windows import RemoteWindow
from .ipc import DEVICE_BODY, DeviceIpc
from .window import attach as attach_device_window

#: the slot kinds of device messages (after shm's own): a large buffer's announcement
#: (rendezvous), and a small message's bytes in the slot (eager)
DEVICE = FIRST_EXTENSION_KIND
DEVICE_EAGER = FIRST_EXTENSION_KIND + 1
DEVICE_KINDS = (DEVICE, DEVICE_EAGER)


class CudaIpcOwner(ShmOwner):
    """What a channel uses of its transport (``CudaIpcTransport``)."""

    device: DeviceIpc


class DeviceEager(NamedTuple):
    """A small device message's bytes, held for a receive not yet posted."""

    data: bytes


class DeviceNotice(NamedTuple):
    """A device buffer's announcement held for a receive not yet posted."""

    body: bytes
    seq: int


class CudaIpcChannel(ShmChannel):
    """An shm channel that also moves device memory (see the module docstring): a send
    without a host view is announced in a ``DEVICE`` slot, and a receive copies from the
    peer's device memory on pycoll's stream."""

    transport: CudaIpcOwner
    message_kinds = (*ShmChannel.message_kinds, *DEVICE_KINDS)

    def __init__(self, transport: CudaIpcOwner, peer: int, inbox: Segment,
                 address: dict[str, Any]) -> None:
        super().__init__(transport, peer, inbox, address)
        self._device = transport.device
        #: queued copies out of the peer's memory: (copy-done event, sequence, receive)
        self._device_reads: deque[tuple[Any, int, Request]] = deque()

    # -- sending -------------------------------------------------------------------------
    def _send_unaddressable(self, req: Request, out: Segment, off: int) -> bool:
        if req.nbytes <= self._payload:
            # small: eager, its bytes in the slot. A rendezvous would hold a completion word
            # and need its sender alive until it is received: 64 unmatched ones stop the pair
            # (messages of other tags wait behind them), and a message held for a receive not
            # yet posted dies with its sender. Costs a device-to-host copy the sender waits for.
            at = off + SLOT_HEADER.size
            try:
                self._device.to_host(req.mem, view_address(out.data[at: at + req.nbytes]))
            except TransportError as err:
                self._sends.popleft()
                self._fail_send(req, err)
                return True
            SLOT_HEADER.pack_into(out.data, off, req.tag, req.nbytes, DEVICE_EAGER, 0)
            self._publish()
            self._sends.popleft()
            req.complete()
            return True
        if self._window_full():
            return False
        self._sends.popleft()
        try:
            body = self._device.export(req.mem, self.peer)
        except TransportError as err:
            self._fail_send(req, err)
            return True
        self._announce(req, out, off, DEVICE, body)
        return True

    def _fail_send(self, req: Request, err: TransportError) -> None:
        """A device message that could not be sent: the peer waits for it in vain, and this
        rank's call most likely waits on a receive from the peer, not on this send: breaking
        the pair fails that wait at once with this error (else it ends at the deadline, as a
        timeout that hides the cause)."""
        req.fail(err)
        self.break_with(err)

    # -- receiving -----------------------------------------------------------------------
    def _memory_fits(self, req: Request, kind: int) -> bool:
        if (req.view is None) == (kind in DEVICE_KINDS):
            return True
        self._memory_mismatch(req, kind in DEVICE_KINDS)
        return False

    def _start_message(self, req: Request | None, tag: int, total: int, kind: int, aux: int,
                       at: int) -> None:
        if kind == DEVICE_EAGER:
            if req is None:
                self.matcher.hold(tag, total, DeviceEager(bytes(self._in.data[at: at + total])))
            else:
                self._eager_read(req, view_address(self._in.data[at: at + total]))
            return
        if kind != DEVICE:
            super()._start_message(req, tag, total, kind, aux, at)
            return
        body = bytes(self._in.data[at: at + DEVICE_BODY.size])
        if req is None:
            self.matcher.hold(tag, total, DeviceNotice(body, aux))
        else:
            self._device_read(req, body, aux)

    def _deliver_held(self, req: Request, nbytes: int, body: Any) -> None:
        device_sent = isinstance(body, (DeviceNotice, DeviceEager))
        if (req.view is None) != device_sent:
            self._memory_mismatch(req, device_sent)
        elif isinstance(body, DeviceNotice):
            if self._size_ok(req, nbytes):
                self._device_read(req, body.body, body.seq)
        elif isinstance(body, DeviceEager):
            if self._size_ok(req, nbytes):
                held = np.frombuffer(body.data, dtype=np.uint8)
                self._eager_read(req, int(held.ctypes.data) if nbytes else 0)
        else:
            super()._deliver_held(req, nbytes, body)

    def _eager_read(self, req: Request, address: int) -> None:
        """A small device message's bytes, at host ``address``, into the receive."""
        try:
            self._device.from_host(req.mem, address)
        except TransportError as err:
            self.break_with(err)
            req.fail(err)
            return
        req.complete()

    def _device_read(self, req: Request, body: bytes, seq: int) -> None:
        """Queue the copy out of the peer's device memory. The receive and the sender's
        request complete together, once the copy has run (``_finish_device_reads``): the
        receiver is then still waiting in pycoll and writes the sender's completion word at
        once. (Completing the receive when the copy was queued left that word to the
        receiver's next call into pycoll: a sender could wait for it forever.)"""
        try:
            done = self._device.read(req.mem, body, self.peer)
        except TransportError as err:
            self.break_with(err)
            req.fail(err)
            return
        self._device_reads.append((done, seq, req))     # done None: an empty message
        self._active[self.peer] = self

    def _finish_device_reads(self, wait: bool = False) -> bool:
        """Complete the reads whose copy has run (``wait``: every read, waiting for it)."""
        reads, moved = self._device_reads, False
        finished = self._device.finished
        while reads and (wait or reads[0][0] is None or finished(reads[0][0])):
            done, seq, req = reads.popleft()
            if wait and done is not None:
                self._device.wait(done)
            self._read_done(seq)
            req.complete()
            moved = True
        return moved

    def _memory_mismatch(self, req: Request, device_sent: bool) -> None:
        sent, posted = ("device", "host") if device_sent else ("host", "device")
        self._refuse(req, TransportError(
            f"rank {self.peer} sent {sent} memory where this rank receives into {posted} "
            f"memory (tag {req.tag}): every rank must pass device buffers, or every rank host "
            "buffers, to one call", peer=self.peer))

    # -- progress ------------------------------------------------------------------------
    def progress(self) -> bool:
        moved = super().progress()
        if self._device_reads:
            moved = self._finish_device_reads() or moved
        return moved

    def busy(self) -> bool:
        return super().busy() or bool(self._device_reads)

    def attach_window(self, record: dict[str, Any], progress: Any = None) -> RemoteWindow:
        """A host window is shm's; a device window is mapped through its IPC handle
        (``window.py``), with shm's control file."""
        if "device_handle" not in record:
            return super().attach_window(record, progress)
        if int(record.get("pid", -1)) != self._peer_pid:
            raise TransportError(f"cuda_ipc: peer rank {self.peer}'s window record names "
                                 "another process", peer=self.peer)
        check_path(str(record.get("path", "")), self._peer_prefix, self.peer)
        return attach_device_window(self._device, self.peer, record)

    def close(self) -> None:
        # copies still queued (receives nobody waited for) finish first, and release their
        # senders, who may be waiting for them
        if self._device_reads:
            try:
                self._finish_device_reads(wait=True)
            except Exception:  # noqa: BLE001 - closing: the pair or the device may be gone
                self._device_reads.clear()
        super().close()
