"""Windows over tcp, emulated by the target's progress engine.

There is no remote memory access over a socket: an origin's ``put``, ``get``, ``accumulate``
or ``signal`` is one *request* frame on the pair's existing (authenticated) channel, tag
``tags.WINDOW_TAG``, and the target applies it when its progress engine reads it, which
happens whenever the target is inside any pycoll call that waits (a collective, a window
operation of its own, ``wait_signal``, ``fence``): there is no background progress thread.
The target answers with a status frame (a get's bytes first), and the origin's operation
returns once the status is in, so every operation is complete at the target when it returns,
as on the other transports. A target that computes in user code delays the reply until it
enters pycoll again, or until the origin's deadline.

A request is ``HEAD`` (kind, op, dtype code, window id, reply number, byte offset, bytes,
signal value), then a put's or accumulate's bytes. The origin checked bounds and dtype
against the target's window before sending (``comm/windows.py``); the target checks every
field again (a peer could be buggy) and refuses what does not fit with an error status,
writing nothing. Accumulates are applied one at a time, under the window's lock (the same
lock as this rank's own accumulates, or shm's byte-range locks when the window also spans
shm peers: ``apply_through``). The target never waits for that lock inside its progress
(its own calls, deadlines and liveness checks would stall behind it): it tries once and, if
another thread or an shm origin holds it, answers *busy* with nothing applied, and the
origin sends the request again, with growing pauses, until its own deadline. A request frame
longer than any open window's bytes breaks the channel (``channel.py``)
instead of being read into memory.
"""
from __future__ import annotations

import itertools
import struct
import time
from typing import Any

import numpy as np

from ... import debug
from ...buffers.memory import MemRef
from ...buffers.reduction import check_op_dtype, parse_op, reducer
from ...errors import CollectiveTimeout, PycollError, TransportError
from ...tags import WINDOW_TAG, dtype_code
from ..base import Request, WindowProgress
from ..windows import ACCUMULATE_OPS, MemoryWindow, RemoteWindow, Update

#: kind, op (index in ACCUMULATE_OPS), dtype code, window id, reply number, byte offset,
#: bytes, signal value
HEAD = struct.Struct("<BBBxIQqqQ")
PUT, GET, ACCUMULATE, SIGNAL = 1, 2, 3, 4
KINDS = {PUT: "put", GET: "get", ACCUMULATE: "accumulate", SIGNAL: "signal"}
#: the status the target answers with: (code, 0); code 0 is success
STATUS = struct.Struct("<qq")
REFUSALS = {1: "the window is not open there (closed, or never made)",
            2: "the bytes fall outside its window",
            3: "the dtype differs from its window's",
            4: "the request is malformed (kind, op or length)",
            5: "its window lock stayed held until the origin's deadline"}
#: the refusal that only means "the window lock is held right now": the origin retries
BUSY = 5
_replies = itertools.count()


def reply_tags(number: int) -> tuple[int, int]:
    """(data, status) tags of the reply to request ``number``."""
    return WINDOW_TAG + 1 + 2 * number, WINDOW_TAG + 2 + 2 * number


class TcpExposedWindow(MemoryWindow):
    """This rank's window as tcp origins reach it: requests served by ``serve``."""

    served = True

    def __init__(self, wid: int, view: memoryview, rank: int, dtype: str, np_dtype: Any,
                 table: dict[int, TcpExposedWindow]) -> None:
        super().__init__(view, rank)
        self.dtype, self.np_dtype = dtype, np.dtype(np_dtype)
        self._table = table
        self.record = {"id": wid}
        #: what served operations go through (``apply_through``)
        self.apply: RemoteWindow = self.local()
        #: requests answered busy so far (diagnostics: lock contention seen by tcp origins)
        self.busy = 0

    def apply_through(self, local: RemoteWindow) -> None:
        self.apply = local

    def close(self) -> None:
        super().close()
        self._table.pop(int(self.record["id"]), None)

    def serve(self, kind: int, op: int, code: int, number: int, offset: int, nbytes: int,
              value: int, data: memoryview, channel: Any) -> None:
        """Apply one request (its fields already parsed) and queue the reply on ``channel``."""
        status = 0
        if self.closed:
            status = 1
        elif code != dtype_code(self.dtype):
            status = 3
        elif offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            status = 2
        elif (kind in (PUT, ACCUMULATE) and data.nbytes != nbytes) or \
                (kind in (GET, SIGNAL) and data.nbytes) or \
                (kind == ACCUMULATE and (op >= len(ACCUMULATE_OPS)
                                         or offset % self.np_dtype.itemsize
                                         or nbytes % self.np_dtype.itemsize)):
            status = 4
        data_tag, status_tag = reply_tags(number)
        if status == 0:
            try:
                status = self._apply(kind, op, offset, nbytes, value, data, channel, data_tag)
            except PycollError as e:
                status = BUSY if isinstance(e, CollectiveTimeout) else 4
                if status == BUSY:
                    self.busy += 1
                else:
                    debug.logger.warning("tcp window: a request from peer rank %d failed: "
                                         "%s", channel.peer, e)
        channel.isend(MemRef.of(STATUS.pack(status, 0)), status_tag)

    def _apply(self, kind: int, op: int, offset: int, nbytes: int, value: int,
               data: memoryview, channel: Any, data_tag: int) -> int:
        deadline = time.monotonic()    # one try at the lock: a held one answers BUSY
        if kind == PUT:
            self.apply.write(offset, data, deadline)
        elif kind == GET:
            # straight from the window (the slice keeps the user's buffer alive until sent)
            channel.isend(MemRef(self.view[offset:offset + nbytes]), data_tag)
        elif kind == ACCUMULATE:
            reduce_op = parse_op(ACCUMULATE_OPS[op])
            try:
                check_op_dtype(reduce_op, self.dtype)
            except PycollError:
                return 4
            src = np.frombuffer(data, dtype=self.np_dtype)
            self.apply.update(offset, nbytes,
                              Update(reduce_op.name, self.dtype, src,
                                     reducer(reduce_op, self.dtype)), deadline)
        elif kind == SIGNAL:
            self.apply.add_signal(value, deadline)
        else:
            return 4
        return 0


def serve_request(windows: dict[int, TcpExposedWindow], body: bytearray, channel: Any) -> None:
    """A request frame's body arrived on ``channel``: apply it to the window it names (or
    refuse it). Never raises: a peer's mistake must not reach the target's caller."""
    try:
        if len(body) < HEAD.size:
            debug.logger.warning("tcp window: peer rank %d sent a request of %d bytes (too "
                                 "short): dropped", channel.peer, len(body))
            return
        kind, op, code, wid, number, offset, nbytes, value = HEAD.unpack_from(body)
        data = memoryview(body)[HEAD.size:]
        win = windows.get(wid)
        if win is None:
            channel.isend(MemRef.of(STATUS.pack(1, 0)), reply_tags(number)[1])
            return
        win.serve(kind, op, code, number, offset, nbytes, value, data, channel)
    except Exception as e:  # noqa: BLE001 - a peer's malformed request: log it, serve on
        debug.logger.warning("tcp window: request from peer rank %d refused: %s",
                             channel.peer, e)


class TcpRemoteWindow(RemoteWindow):
    """An origin's handle: each operation is a request and a reply on the pair's channel."""

    def __init__(self, channel: Any, record: dict[str, Any], progress: WindowProgress,
                 dtype: str) -> None:
        self.channel = channel
        self.peer = channel.peer
        self.wid = int(record["id"])
        self._progress = progress
        self._code = dtype_code(dtype)

    def request(self, kind: int, offset: int, nbytes: int, deadline: float,
                payload: memoryview | None = None, into: memoryview | None = None,
                op: int = 0, value: int = 0, code: int | None = None) -> None:
        """Send one request and wait for its reply (a get's bytes land in ``into``); while
        the target answers busy (nothing applied), send it again until ``deadline``."""
        pause = 10e-6
        while True:
            code_back = self._once(kind, offset, nbytes, deadline, payload, into, op, value,
                                   code)
            if code_back != BUSY:
                break
            now = time.monotonic()
            if now >= deadline:
                raise CollectiveTimeout(f"tcp: peer rank {self.peer}'s window lock stayed "
                                        f"held until the deadline of the "
                                        f"{KINDS.get(kind, kind)}; nothing was written")
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 1e-3)
        if code_back:
            raise TransportError(f"tcp: peer rank {self.peer} refused the window's "
                                 f"{KINDS.get(kind, kind)}: "
                                 f"{REFUSALS.get(code_back, f'code {code_back}')}; nothing "
                                 "was written", peer=self.peer)

    def _once(self, kind: int, offset: int, nbytes: int, deadline: float,
              payload: memoryview | None, into: memoryview | None, op: int, value: int,
              code: int | None) -> int:
        """One request and its reply: the status code."""
        number = next(_replies)
        data_tag, status_tag = reply_tags(number)
        head = HEAD.pack(kind, op, self._code if code is None else code, self.wid, number,
                         offset, nbytes, value)
        frame = head if payload is None else b"".join((head, payload))
        status = bytearray(STATUS.size)
        ch = self.channel

        def post() -> tuple[list[Request], list[Request]]:
            reqs = []
            if into is not None:
                reqs.append(ch.irecv(MemRef.of(into), data_tag))
            reqs.append(ch.irecv(MemRef.of(status), status_tag))
            reqs.append(ch.isend(MemRef.of(frame), WINDOW_TAG))
            # the status comes after a get's bytes (one ordered channel): wait for it; a
            # refusal sends no bytes, and the progress withdraws their receive
            return reqs, reqs[-2:]
        self._progress(post, deadline)
        return int(STATUS.unpack(status)[0])

    def write(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        self.request(PUT, offset, view.nbytes, deadline, payload=view.cast("B"))

    def read(self, offset: int, view: memoryview, deadline: float = 0.0) -> None:
        self.request(GET, offset, view.nbytes, deadline, into=view.cast("B"))

    def update(self, offset: int, nbytes: int, fn: Any, deadline: float) -> None:
        if not isinstance(fn, Update) or fn.op not in ACCUMULATE_OPS:
            raise TransportError("tcp: an accumulate ships its op and source (an Update)",
                                 peer=self.peer)
        src = MemRef.of(np.ascontiguousarray(fn.src)).view
        self.request(ACCUMULATE, offset, nbytes, deadline, payload=src,
                     op=ACCUMULATE_OPS.index(fn.op))

    def add_signal(self, value: int, deadline: float) -> None:
        self.request(SIGNAL, 0, 0, deadline, value=value)

    def close(self) -> None:
        pass
