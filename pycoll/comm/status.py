"""The status responder: how a running rank answers ``python -m pycoll.status``.

Every rank of a root communicator (size > 1) over a store with an address (``TCPStore``;
an in-process ``LocalStore``'s thread ranks have nobody outside to answer) starts one daemon
thread with a
listening socket of its own, on the address this host uses to reach the store (so whoever
reaches the store can usually reach it), and publishes that address under
``pycoll/<root>/status/<rank>``. A query is one connection: the responder sends a nonce, the
client proves it knows the job secret (``PYCOLL_TOKEN``) with the store's HMAC handshake
(``rendezvous.protocol.client_mac``, under its own service name so that a proof for one
service is never one for the other), and the responder answers with its own proof and the
communicator's state (``Communicator.status``, read by ``runtime.status.snapshot`` from what
the call path keeps anyway), then closes. Nothing runs on the call path: the thread sleeps
in ``select`` until someone asks.

What the thread cannot do is run while another thread holds the GIL: a main thread inside a
long C call that does not release it (some numpy and torch operations) leaves the query
unanswered until the call returns; the client then reports the rank as unreachable and says
why (docs/observability.md). The fast path's kernels release the GIL while they spin, so a
rank waiting in a fast-path collective answers.

Hostile input is handled like the store's: frames are length-prefixed and a request larger
than a handshake frame closes the connection, every connection has a deadline from its
accept to its last byte, and at most ``MAX_CONNECTIONS`` are open at once (the oldest is
dropped first), so garbage, truncated frames, idle floods, slow clients and wrong secrets
cost a closed socket and nothing else.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import selectors
import socket
import statistics
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rendezvous import Store
from rendezvous import protocol as P

from .. import debug
from ..envvars import env_bool, env_float
from ..transports.shm.cma import process_exited
from .membership import alive_key, gone_keys

#: the service name in the HMAC proofs (``rendezvous.protocol.client_mac``)
SERVICE = b"pycoll-status"
#: the first frame's first blob: what this port speaks
MAGIC = b"pycoll-status/1"
#: a connection's whole life, accept to last byte, at most (slow clients, idle floods)
CONNECTION_SECONDS = 5.0
#: connections open at once; beyond it the oldest is dropped (floods)
MAX_CONNECTIONS = 64
#: the request frame's opcode, and the reply's statuses (``rendezvous.protocol.Status``)
OP_STATUS = 1


def status_key(root_name: str, rank: int) -> str:
    return f"pycoll/{root_name}/status/{rank}"


def boot_id() -> str:
    """Equal for processes whose ``time.monotonic`` is the same clock (one booted kernel)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def local_address(host: str, port: int) -> str:
    """The address of this host on the route to ``host:port`` (the store)."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(info[0], socket.SOCK_DGRAM) as s:
            s.connect(info[4])          # a datagram socket's connect only picks the route
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def secret_bytes(token: str | bytes | None) -> bytes:
    """The HMAC key: the job secret, or the empty key for a job without one (as the data
    ports' handshake does, ``transports.wireup.proof``)."""
    if token is None:
        return b""
    return token.encode() if isinstance(token, str) else bytes(token)


def unauthenticated_warning(host: str, token: str | bytes | None, rank: int) -> str | None:
    """What a rank warns at start when its status port answers anyone who reaches it (no job
    secret: the empty HMAC key) on an address other hosts reach; None when it asks a secret
    or listens on the loopback only. A warning, not a loopback bind: a job of several hosts
    without a secret is surveyed from the other hosts too, as its store is reached."""
    if token:
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        if host == "localhost":
            return None
    return (f"rank {rank}: the status port on {host} asks no secret (no PYCOLL_TOKEN) and "
            "other hosts reach it: anyone there can read this rank's state; set PYCOLL_TOKEN "
            "(python -m pycoll.run makes one) or PYCOLL_STATUS=0")


class _Conn:
    __slots__ = ("sock", "nonce", "inbuf", "out", "deadline", "peer")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.nonce = secrets.token_bytes(P.NONCE_SIZE)
        self.inbuf = bytearray()
        self.out = b""
        self.deadline = time.monotonic() + CONNECTION_SECONDS


class Responder:
    """One rank's status port: a daemon thread answering queries with ``describe()``.

    The thread is a selector loop that survives hostile clients (a deadline and a size limit
    per connection, the oldest dropped when too many are open); ``comm/metrics.py`` serves
    HTTP from the same loop by overriding ``_greeting`` and ``_request``."""

    thread_name = "pycoll-status"

    def __init__(self, host: str, token: str | bytes | None,
                 describe: Callable[[], dict[str, Any]], port: int = 0) -> None:
        self.key = secret_bytes(token)
        self.describe = describe
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        self.sock = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            self.sock.bind(info[4])
            self.sock.listen(128)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.host = host
        self.port = int(self.sock.getsockname()[1])
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name=self.thread_name, daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the thread still serves (it never stops on bad input)."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop answering; the port refuses connections from now on."""
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        for s in (self._wake_w,):
            s.close()

    # -- the thread --------------------------------------------------------------------
    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        conns: OrderedDict[int, _Conn] = OrderedDict()
        sel.register(self.sock, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stop:
                # idle: sleep until someone connects (no wake-ups of a rank nobody asks)
                for key, mask in sel.select(timeout=0.5 if conns else None):
                    if key.fileobj is self.sock:
                        self._accept(sel, conns)
                    elif key.fileobj is self._wake_r:
                        continue
                    else:
                        self._step(sel, conns, key.data, mask)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline < now]:
                    self._drop(sel, conns, conn, "did not finish before its deadline")
        except Exception as e:  # noqa: BLE001 - the thread must never take the rank down
            debug.logger.warning("pycoll status responder stopped: %s", e)
        finally:
            for conn in list(conns.values()):
                self._drop(sel, conns, conn, None)
            sel.close()
            self.sock.close()
            self._wake_r.close()

    def _accept(self, sel: selectors.BaseSelector, conns: OrderedDict[int, _Conn]) -> None:
        for _ in range(64):
            try:
                sock, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:      # out of descriptors: the oldest make room
                debug.logger.info("status responder: accept failed: %s", e)
                if conns:
                    self._drop(sel, conns, next(iter(conns.values())), "descriptors ran out")
                return
            sock.setblocking(False)
            while len(conns) >= MAX_CONNECTIONS:
                self._drop(sel, conns, next(iter(conns.values())), "too many connections")
            conn = _Conn(sock, str(addr))
            conn.out = self._greeting(conn)
            conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_WRITE if conn.out else selectors.EVENT_READ,
                         conn)

    def _drop(self, sel: selectors.BaseSelector, conns: OrderedDict[int, _Conn], conn: _Conn,
              why: str | None) -> None:
        if why:
            debug.logger.info("status responder: closing connection from %s: %s",
                              conn.peer, why)
        conns.pop(conn.sock.fileno(), None)
        try:
            sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _step(self, sel: selectors.BaseSelector, conns: OrderedDict[int, _Conn], conn: _Conn,
              mask: int) -> None:
        try:
            if mask & selectors.EVENT_WRITE:
                sent = conn.sock.send(conn.out)
                conn.out = conn.out[sent:]
                if not conn.out:
                    if conn.inbuf is None:          # the answer went out: done
                        self._drop(sel, conns, conn, None)
                    else:
                        sel.modify(conn.sock, selectors.EVENT_READ, conn)
                return
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._drop(sel, conns, conn, str(e))
            return
        if not data:
            self._drop(sel, conns, conn, "closed before its request was complete")
            return
        conn.inbuf += data
        try:
            answer = self._request(conn)
        except ValueError as e:
            self._drop(sel, conns, conn, str(e))
            return
        if answer is None:
            return
        conn.out = answer
        conn.inbuf = None       # type: ignore[assignment]  # nothing more is read
        sel.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _greeting(self, conn: _Conn) -> bytes:
        """What a new connection is sent first: the handshake's challenge."""
        return P.encode_message(0, 0, [MAGIC, conn.nonce])

    def _request(self, conn: _Conn) -> bytes | None:
        """The answer once ``conn.inbuf`` holds a whole request, None while it does not;
        ValueError for a hostile one (the connection is dropped)."""
        head = P.FRAME_HEADER.size
        if len(conn.inbuf) < head:
            return None
        (n,) = P.FRAME_HEADER.unpack_from(conn.inbuf)
        if n > P.MAX_HANDSHAKE_FRAME or len(conn.inbuf) > head + n:
            raise ValueError(f"a request frame of {n} bytes (hostile)")
        if len(conn.inbuf) < head + n:
            return None
        return self._answer(conn, bytes(conn.inbuf[head:]))

    def _answer(self, conn: _Conn, payload: bytes) -> bytes:
        try:
            op, _arg, blobs = P.decode_message(payload)
        except P.MalformedFrame as e:
            return P.encode_message(P.Status.ERROR, 0, [f"malformed request: {e}".encode()])
        if op != OP_STATUS or len(blobs) != 2:
            return P.encode_message(P.Status.ERROR, 0, [b"unknown request"])
        cnonce, mac = blobs
        expected = P.client_mac(self.key, conn.nonce, cnonce, SERVICE)
        if not hmac.compare_digest(mac, expected):
            debug.logger.info("status responder: wrong secret from %s", conn.peer)
            return P.encode_message(P.Status.ERROR, 0, [
                b"authentication failed: the job secret (PYCOLL_TOKEN) is wrong or missing"])
        try:
            body = json.dumps(self.describe(), default=str).encode()
        except Exception as e:  # noqa: BLE001 - a status must answer, even if only this
            body = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
        proof = P.server_mac(self.key, conn.nonce, cnonce, SERVICE)
        return P.encode_message(P.Status.OK, 0, [proof, body])


def start(store: Store, address: tuple[str, int], root_name: str, rank: int, size: int,
          token: str | None, describe: Callable[[], dict[str, Any]]) -> Responder | None:
    """Start this rank's responder on the route to the store at ``address`` and publish its
    address; None when ``PYCOLL_STATUS=0`` or it cannot (the job runs on without it, and
    says so in the debug log)."""
    if not env_bool("PYCOLL_STATUS", True):
        return None
    try:
        responder = Responder(local_address(*address), token, describe)
    except OSError as e:
        debug.logger.info("no status responder: %s", e)
        return None
    warning = unauthenticated_warning(responder.host, token, rank)
    if warning is not None:
        debug.logger.warning("%s", warning)
    record = {"host": responder.host, "port": responder.port, "pid": os.getpid(),
              "hostname": socket.gethostname(), "boot_id": boot_id(), "size": size}
    try:
        store.set(status_key(root_name, rank), json.dumps(record))
    except Exception as e:  # noqa: BLE001 - a store that refuses: the job runs on
        debug.logger.info("status responder not published: %s", e)
        responder.close()
        return None
    return responder


class Refused(Exception):
    """The responder refused the query (a wrong or missing secret)."""


def _read_frame(sock: socket.socket, deadline: float, limit: int) -> bytes:
    buf = bytearray()
    need = P.FRAME_HEADER.size
    while True:
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer before the deadline")
            sock.settimeout(left)
            chunk = sock.recv(max(65536, need - len(buf)))
            if not chunk:
                raise ConnectionResetError("the responder closed the connection")
            buf += chunk
        if need == P.FRAME_HEADER.size:
            (n,) = P.FRAME_HEADER.unpack_from(buf)
            if n > limit:
                raise ConnectionError(f"an answer frame of {n} bytes is too large")
            need += n
            continue
        return bytes(buf[P.FRAME_HEADER.size:need])


def query(host: str, port: int, token: str | bytes | None,
          timeout: float) -> tuple[dict[str, Any], float, float]:
    """Ask one responder for its state: (the state, when the request left, when the answer
    came, both on this process's ``time.monotonic``: the round trip that bounds the rank's
    clock offset). Raises ``Refused`` (wrong secret), ``ConnectionRefusedError`` (nothing
    listens: the process is gone or closed its communicator), ``TimeoutError`` (no answer
    in ``timeout`` seconds) or another ``OSError``."""
    deadline = time.monotonic() + timeout
    key = secret_bytes(token)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        code, _arg, blobs = P.decode_message(_read_frame(sock, deadline, P.MAX_HANDSHAKE_FRAME))
        if len(blobs) != 2 or blobs[0] != MAGIC:
            raise ConnectionError(f"{host}:{port} is not a pycoll status port")
        cnonce = secrets.token_bytes(P.NONCE_SIZE)
        sent = time.monotonic()
        sock.sendall(P.encode_message(OP_STATUS, 0, [cnonce, P.client_mac(key, blobs[1], cnonce,
                                                                          SERVICE)]))
        code, _arg, reply = P.decode_message(_read_frame(sock, deadline, 64 << 20))
        came = time.monotonic()
    if code != P.Status.OK:
        raise Refused(reply[0].decode(errors="replace") if reply else "refused")
    if len(reply) != 2 or not hmac.compare_digest(
            reply[0], P.server_mac(key, blobs[1], cnonce, SERVICE)):
        raise Refused("the responder could not prove it knows the job secret")
    return json.loads(reply[1]), sent, came


# -- asking every rank: the status tool's survey, and Communicator.stats --------------------
#: a rank is a straggler when it is last in at least this share of the calls compared
#: (and in at least twice its fair share, 2/size) ...
STRAGGLER_FRACTION = 0.5
#: ... of at least this many calls
STRAGGLER_MIN_CALLS = 20


def records(store: Any, name: str, timeout: float) -> tuple[int, list[dict[str, Any] | None],
                                                              list[bool]]:
    """(the world size, each rank's status record or None, each rank's lease says gone)."""
    first = json.loads(store.get(status_key(name, 0), timeout=timeout))
    size = int(first["size"])
    keys = [status_key(name, r) for r in range(size)]
    records: list[dict[str, Any] | None] = [first] + [None] * (size - 1)
    if store.check(keys):
        records = [json.loads(v) for v in store.multi_get(keys, timeout=timeout)]
    else:
        for r in range(1, size):
            if store.check([keys[r]]):
                records[r] = json.loads(store.get(keys[r], timeout=timeout))
    gone = [False] * size
    for r in gone_keys(store, [alive_key(name, r) for r in range(size)]):
        gone[r] = True
    return size, records, gone


def ask(rank: int, record: dict[str, Any] | None, gone: bool, token: str | None,
        timeout: float, my_boot: str) -> dict[str, Any]:
    """One rank's row: its answer, or why there is none (dead, unreachable)."""
    if record is None:
        return {"rank": rank, "state": "unreachable", "host": None, "pid": None,
                "reason": "it never published a status address (not started yet, "
                          "PYCOLL_STATUS=0, or an older pycoll)"}
    row: dict[str, Any] = {"rank": rank, "host": record.get("hostname"), "pid": record.get("pid"),
                           "address": f"{record['host']}:{record['port']}"}
    # one kernel: one monotonic clock; one host as well: one process table to look in
    local = bool(my_boot) and record.get("boot_id") == my_boot
    here = local and record.get("hostname") == socket.gethostname()
    if gone:
        return {**row, "state": "dead", "reason": "its store lease is gone (the process "
                                                  "exited, was killed, or lost the store)"}
    try:
        answer, sent, came = query(record["host"], int(record["port"]), token, timeout)
    except Refused:
        raise
    except ConnectionRefusedError:
        return {**row, "state": "dead", "reason": "its status port refuses connections (the "
                                                  "process exited or finalized)"}
    except TimeoutError:
        if here and process_exited(int(record["pid"])):
            return {**row, "state": "dead", "reason": f"process {record['pid']} is gone"}
        return {**row, "state": "unreachable",
                "reason": f"no answer within {timeout:g} s: its main thread may hold the GIL "
                          "in a long C call (docs/observability.md), or its host is overloaded"}
    except OSError as e:
        if here and process_exited(int(record["pid"])):
            return {**row, "state": "dead", "reason": f"process {record['pid']} is gone"}
        return {**row, "state": "unreachable", "reason": f"{type(e).__name__}: {e}"}
    comm = answer["communicators"][0]
    # the rank's clock minus ours: 0 on one kernel (one monotonic clock), else NTP's estimate
    offset = 0.0 if local else comm["now"] - (sent + came) / 2
    row.update(transport=answer.get("transport"), clock_offset_s=offset,
               clock_error_s=0.0 if local else (came - sent) / 2,
               communicators=answer["communicators"])
    row.update({k: v for k, v in comm.items() if k not in ("arrivals", "now", "rank", "size")})
    row["communicator"] = comm["name"]
    row["rank"] = rank
    return row


def stragglers(rows: list[dict[str, Any]], size: int, last: int = 1000) -> list[dict[str, Any]]:
    """Ranks that arrive last in most collectives, from the ranks' recent start times put on
    this process's clock with each row's ``clock_offset_s`` (docs/observability.md,
    "Stragglers"): per call every rank took part in, the last rank and how much later than
    the second-to-last it started."""
    answered = [r for r in rows if r.get("communicators")]
    if size < 2 or len(answered) < size:
        return []
    starts: dict[tuple[int, str], list[tuple[float, int]]] = {}
    for r in answered:
        for seq, collective, t in r["communicators"][0].get("arrivals", []):
            starts.setdefault((seq, collective), []).append((t - r["clock_offset_s"], r["rank"]))
    full = sorted(k for k, v in starts.items() if len(v) == size)[-last:]
    error = max(r["clock_error_s"] for r in answered)
    by_collective: dict[str, list[tuple[int, float]]] = {}
    for key in full:
        arrivals = sorted(starts[key])
        by_collective.setdefault(key[1], []).append(
            (arrivals[-1][1], arrivals[-1][0] - arrivals[-2][0]))
    out = []
    for collective, lasts in sorted(by_collective.items()):
        if len(lasts) < STRAGGLER_MIN_CALLS:
            continue
        counts = Counter(rank for rank, _ in lasts)
        for rank, n in counts.most_common():
            fraction = n / len(lasts)
            if fraction < max(STRAGGLER_FRACTION, 2 / size):
                break
            late = statistics.median(d for k, d in lasts if k == rank)
            if late <= 2 * error:      # within what the clocks can tell apart
                continue
            out.append({"rank": rank, "collective": collective, "calls": len(lasts),
                        "late_fraction": round(fraction, 3),
                        "median_late_ms": round(late * 1e3, 3)})
    return out


def survey(store: Store, name: str, token: str | None, timeout: float
           ) -> tuple[int, list[dict[str, Any]]]:
    """(the world size, a row per rank: its answer or why none came), every rank asked at
    once; rows carry their ``communicators`` (``pycoll.status`` and ``stats`` use them)."""
    size, recs, gone = records(store, name, max(timeout, 5.0))
    mine = boot_id()
    with ThreadPoolExecutor(max_workers=min(64, size)) as pool:
        rows = list(pool.map(lambda r: ask(r, recs[r], gone[r], token, timeout, mine),
                             range(size)))
    return size, rows


def straggler_line(s: dict[str, Any]) -> str:
    """One entry of ``stragglers`` in words."""
    return (f"straggler: rank {s['rank']} arrives last in {s['late_fraction']:.0%} of the last "
            f"{s['calls']} {s['collective']}s, by {s['median_late_ms']:.1f} ms median")


def job_stragglers(address: tuple[str, int], name: str, token: str | None,
                   timeout: float = 2.0) -> list[dict[str, Any]]:
    """The job's stragglers, surveyed over a store connection of the caller's own (a thread
    beside the rank's main one must not share the rank's)."""
    from rendezvous import TCPStore
    with TCPStore(*address, token=token, timeout=5.0) as store:
        size, rows = survey(store, name, token, timeout)
    return stragglers(rows, size)


#: how old rank 0's metrics page lets its straggler scores get (``SurveyCache``)
METRICS_SURVEY_SECONDS = 10.0


class SurveyCache:
    """The job's stragglers for rank 0's metrics page: surveyed on a thread of its own, at
    most once per ``every`` seconds. A scrape reads the last result and never waits for a
    survey: one takes every rank's GIL for a moment and a store connection and status query
    that may each take seconds, and the metrics port asks no secret, so a local client that
    scraped in a loop would otherwise keep the whole job surveying and the port's other
    scrapes waiting. ``survey()`` returns the stragglers (``job_stragglers``)."""

    def __init__(self, survey: Callable[[], list[dict[str, Any]]], every: float) -> None:
        self._survey = survey
        self.every = every
        self._lock = threading.Lock()
        self._found: list[dict[str, Any]] | None = None
        self._due = 0.0
        self._running = False

    def get(self) -> list[dict[str, Any]] | None:
        """The last survey's stragglers (None before the first has finished); starts the
        next survey when the last is older than ``every`` seconds and none runs."""
        with self._lock:
            now = time.monotonic()
            if not self._running and now >= self._due:
                self._running = True
                self._due = now + self.every
                threading.Thread(target=self._run, name="pycoll-metrics-survey",
                                 daemon=True).start()
            return self._found

    def _run(self) -> None:
        found = None
        try:
            found = self._survey()
        except Exception as e:  # noqa: BLE001 - the counts still answer
            debug.logger.info("metrics: no straggler survey (%s)", e)
        with self._lock:
            if found is not None:
                self._found = found
            self._running = False


class StragglerLog:
    """``PYCOLL_STRAGGLER_LOG=SECONDS``: rank 0 surveys the job every SECONDS from a thread
    of its own and logs a warning per persistent straggler (off by default: the survey
    takes every rank's GIL for a moment)."""

    def __init__(self, address: tuple[str, int], name: str, token: str | None,
                 every: float) -> None:
        self.address, self.name, self.token, self.every = address, name, token, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pycoll-straggler-log",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                for s in job_stragglers(self.address, self.name, self.token):
                    debug.logger.warning("%s", straggler_line(s))
            except Exception as e:  # noqa: BLE001 - a log line must not take the rank down
                debug.logger.info("straggler log: no survey (%s)", e)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(10.0)


def start_log(address: tuple[str, int], name: str, rank: int,
              token: str | None) -> StragglerLog | None:
    """Rank 0's straggler log, where ``PYCOLL_STRAGGLER_LOG`` asks for one."""
    every = env_float("PYCOLL_STRAGGLER_LOG", 0.0, minimum=0.0)
    if rank != 0 or every <= 0 or not env_bool("PYCOLL_STATUS", True):
        return None
    return StragglerLog(address, name, token, every)
