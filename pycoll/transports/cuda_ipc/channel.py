"""``CudaIpcChannel``: an shm channel with one more message kind, device memory (see the
package's docstring for the protocol)."""
from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

from ...errors import TransportError
from ..base import Request
from ..shm.channel import ShmChannel, ShmOwner
from ..shm.segment import DONE_BASE, FIRST_EXTENSION_KIND, RNDV_WINDOW, Segment
from .ipc import DEVICE_BODY, DeviceIpc

#: the slot kind of a device buffer's announcement (after shm's own kinds)
DEVICE = FIRST_EXTENSION_KIND


class CudaIpcOwner(ShmOwner):
    """What a channel uses of its transport (``CudaIpcTransport``)."""

    device: DeviceIpc


class DeviceNotice(NamedTuple):
    """A device buffer's announcement held for a receive not yet posted."""

    body: bytes
    seq: int


class CudaIpcChannel(ShmChannel):
    """An shm channel that also moves device memory (see the module docstring): a send
    without a host view is announced in a ``DEVICE`` slot, and a receive copies from the
    peer's device memory on pycoll's stream."""

    transport: CudaIpcOwner
    message_kinds = (*ShmChannel.message_kinds, DEVICE)

    def __init__(self, transport: CudaIpcOwner, peer: int, inbox: Segment,
                 address: dict[str, Any]) -> None:
        super().__init__(transport, peer, inbox, address)
        self._device = transport.device
        #: queued copies out of the peer's memory: (copy-done event, sequence, receive)
        self._device_reads: deque[tuple[Any, int, Request]] = deque()

    # -- sending -------------------------------------------------------------------------
    def _send_unaddressable(self, req: Request, out: Segment, off: int) -> bool:
        if self._window_full():
            return False
        self._sends.popleft()
        try:
            body = self._device.export(req.mem, self.peer)
        except TransportError as err:
            req.fail(err)       # nothing was announced: the pair stays in step
            return True
        self._announce(req, out, off, DEVICE, body)
        return True

    # -- receiving -----------------------------------------------------------------------
    def _memory_fits(self, req: Request, kind: int) -> bool:
        if (req.view is None) == (kind == DEVICE):
            return True
        self._memory_mismatch(req, kind == DEVICE)
        return False

    def _start_message(self, req: Request | None, tag: int, total: int, kind: int, aux: int,
                       at: int) -> None:
        if kind != DEVICE:
            super()._start_message(req, tag, total, kind, aux, at)
            return
        body = bytes(self._in.data[at: at + DEVICE_BODY.size])
        if req is None:
            self._match.hold(tag, total, DeviceNotice(body, aux))
        else:
            self._device_read(req, body, aux)

    def _deliver_held(self, req: Request, nbytes: int, body: Any) -> None:
        if (req.view is None) != isinstance(body, DeviceNotice):
            self._memory_mismatch(req, isinstance(body, DeviceNotice))
        elif isinstance(body, DeviceNotice):
            if self._size_ok(req, nbytes):
                self._device_read(req, body.body, body.seq)
        else:
            super()._deliver_held(req, nbytes, body)

    def _device_read(self, req: Request, body: bytes, seq: int) -> None:
        """Queue the copy out of the peer's device memory. The receive and the sender's
        request complete together, once the copy has run (``_finish_device_reads``): the
        receiver is then still waiting in pycoll and writes the sender's completion word at
        once. (Completing the receive when the copy was queued left that word to the
        receiver's next call into pycoll: a sender could wait for it forever.)"""
        try:
            done = self._device.read(req.mem, body, self.peer)
        except TransportError as err:
            self._break(err)
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
            self._in.ctrl[DONE_BASE + seq % RNDV_WINDOW] = seq + 1
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

    def close(self) -> None:
        # copies still queued (receives nobody waited for) finish first, and release their
        # senders, who may be waiting for them
        if self._device_reads:
            try:
                self._finish_device_reads(wait=True)
            except Exception:  # noqa: BLE001 - closing: the pair or the device may be gone
                self._device_reads.clear()
        super().close()
