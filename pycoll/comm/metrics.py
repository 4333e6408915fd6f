"""``PYCOLL_METRICS_PORT``: an opt-in OpenMetrics (Prometheus) endpoint, one per rank.

Per rank, not aggregated by the launcher: Prometheus scrapes targets and labels each one, a
rank's endpoint needs no other rank to answer (a hung or dead rank does not blank the rest),
and torchrun, Slurm, Ray or Spark jobs have no pycoll launcher to aggregate them. Rank 0 adds
the job's straggler scores, which need every rank: it surveys the status ports at scrape time
(as ``PYCOLL_STRAGGLER_LOG`` does).

The endpoint is off unless ``PYCOLL_METRICS_PORT`` is set (rank r listens on that port + r;
0: a free port), binds ``PYCOLL_METRICS_ADDR`` (default 127.0.0.1, loopback: a scraper on
another host needs it set), and needs no secret (Prometheus sends none; what it shows is
counts, not data). The address is published in the store at ``pycoll/<name>/metrics/<rank>``.
It is served from the status port's selector loop (``status.Responder``: a deadline and a
size limit per connection, the oldest dropped when too many are open), and everything it
shows is tallied at scrape time from the flight recorder (``runtime/metrics.py``): the call
path does no work for it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import debug
from ..envvars import env_int, env_text
from .status import Responder, _Conn

#: the longest request head read (a scraper's GET is a few hundred bytes)
MAX_REQUEST = 8192
CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def metrics_key(root_name: str, rank: int) -> str:
    return f"pycoll/{root_name}/metrics/{rank}"


def _http(code: int, reason: str, body: bytes, ctype: str = "text/plain; charset=utf-8"
          ) -> bytes:
    head = (f"HTTP/1.0 {code} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class MetricsServer(Responder):
    """HTTP/1.0 ``GET /metrics`` answered with ``render()``, one request per connection."""

    thread_name = "pycoll-metrics"

    def __init__(self, host: str, port: int, render: Callable[[], str]) -> None:
        self.render = render          # before the thread starts
        super().__init__(host, None, dict, port=port)

    def _greeting(self, conn: _Conn) -> bytes:
        return b""                    # HTTP: the client speaks first

    def _request(self, conn: _Conn) -> bytes | None:
        buf = bytes(conn.inbuf)
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            end = buf.find(b"\n\n")
        if end < 0:
            if len(buf) > MAX_REQUEST:
                raise ValueError(f"a request head over {MAX_REQUEST} bytes (hostile)")
            return None
        words = buf.split(b"\n", 1)[0].split()
        if len(words) < 2 or not words[0].isalpha():
            return _http(400, "Bad Request", b"not an HTTP request\n")
        if words[0] != b"GET":
            return _http(405, "Method Not Allowed", b"GET /metrics\n")
        if words[1].split(b"?")[0] not in (b"/metrics", b"/"):
            return _http(404, "Not Found", b"GET /metrics\n")
        try:
            body = self.render().encode()
        except Exception as e:  # noqa: BLE001 - a scrape must never take the rank down
            debug.logger.info("metrics: rendering failed: %s", e)
            return _http(500, "Internal Server Error", f"{type(e).__name__}: {e}\n".encode())
        return _http(200, "OK", body, CONTENT_TYPE)


def start(store: Any, root_name: str, rank: int, render: Callable[[], str]
          ) -> MetricsServer | None:
    """This rank's endpoint where ``PYCOLL_METRICS_PORT`` asks for one, else None. A port
    that cannot be opened is logged and the job runs on without it."""
    if env_text("PYCOLL_METRICS_PORT") is None:
        return None
    base = env_int("PYCOLL_METRICS_PORT", 0, minimum=0)
    host = env_text("PYCOLL_METRICS_ADDR") or "127.0.0.1"
    try:
        server = MetricsServer(host, base + rank if base else 0, render)
    except OSError as e:
        debug.logger.warning("rank %d: no metrics endpoint on %s:%s: %s", rank, host,
                             base + rank if base else 0, e)
        return None
    where = f"{server.host}:{server.port}"
    debug.logger.info("rank %d: metrics at http://%s/metrics", rank, where)
    if store is not None:
        try:
            store.set(metrics_key(root_name, rank), where)
        except Exception as e:  # noqa: BLE001 - a store that refuses: the endpoint still serves
            debug.logger.info("metrics address not published: %s", e)
    return server

