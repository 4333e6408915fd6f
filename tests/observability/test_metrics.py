"""PYCOLL_METRICS_PORT: 4 real rank processes serve OpenMetrics; scraped over HTTP and parsed
with prometheus_client's OpenMetrics parser, the counts are the calls the job made, and
hostile clients on the port (garbage, an idle flood, a slow client) disturb neither the job's
results nor the scrape. Skips where prometheus_client (the test extra) is absent."""
from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pycoll.comm.metrics import metrics_key
from rendezvous import TCPStore

from .test_status import TOKEN, _all_done

parser = pytest.importorskip("prometheus_client.openmetrics.parser",
                             reason="prometheus_client (pip install .[test]) parses the page")

pytestmark = pytest.mark.timeout(300)
JOB = str(Path(__file__).with_name("metrics_job.py"))
N = 4
CALLS = 40


def _wait_for(path: Path, deadline: float = 120.0) -> None:
    end = time.monotonic() + deadline
    while not path.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared (see the ranks' output)"


def _addresses(address: str) -> list[tuple[str, int]]:
    host, port = address.rsplit(":", 1)
    with TCPStore(host, int(port), token=TOKEN, timeout=120) as store:
        out = []
        for r in range(N):
            store.wait([metrics_key("world", r)])
            h, p = store.get(metrics_key("world", r)).decode().rsplit(":", 1)
            out.append((h, int(p)))
    return out


def _scrape(where: tuple[str, int]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{where[0]}:{where[1]}/metrics", timeout=60) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        text = r.read().decode()
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "rank"))
            samples[(s.name, labels)] = s.value
    return samples


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _timed(samples: dict, timing: str | None = None, **labels: str) -> float:
    """The latency histogram's ``_count`` for ``labels``, summed over its timings (or of
    one ``timing``); 0 where it has no series."""
    want = set(labels.items())
    return sum(v for (name, lab), v in samples.items()
               if name == "pycoll_collective_latency_seconds_count" and want <= set(lab)
               and (timing is None or ("timing", timing) in lab))


def test_metrics_count_the_calls_made_and_survive_hostile_clients(job: Any,
                                                                  tmp_path: Path) -> None:
    start = tmp_path / "start"
    j = job(N, script=JOB, CALLS=CALLS, START=start, READY=tmp_path / "ready",
            PYCOLL_METRICS_PORT=0)
    where = _addresses(j.address)
    assert all(h == "127.0.0.1" for h, _ in where), where     # loopback unless told
    # hostile clients on rank 0's and rank 1's ports, held open while the job runs
    held = []
    for target in where[:2]:
        for _ in range(100):                       # an idle flood
            held.append(socket.create_connection(target, timeout=30))
        g = socket.create_connection(target, timeout=30)
        g.sendall(os.urandom(20000))               # garbage, over the head limit
        held.append(g)
        slow = socket.create_connection(target, timeout=30)
        slow.sendall(b"GET /met")                  # a slow client: never finishes
        held.append(slow)
    try:
        start.touch()
        for r in range(N):                         # the job ran its calls under attack
            ready = tmp_path / f"ready.{r}"
            _wait_for(ready)
        for rank, target in enumerate(where):
            samples = _scrape(target)
            lab = {"communicator": "world"}
            assert _get(samples, "pycoll_collective_calls_total", **lab,
                        collective="allreduce", size_class="le1KiB") == CALLS
            assert _get(samples, "pycoll_collective_bytes_total", **lab,
                        collective="allreduce", size_class="le1KiB") == CALLS * 16
            assert _get(samples, "pycoll_collective_calls_total", **lab,
                        collective="broadcast", size_class="le1MiB") == CALLS
            assert _get(samples, "pycoll_collective_bytes_total", **lab,
                        collective="broadcast", size_class="le1MiB") == CALLS * (1 << 20)
            for c, k in (("allreduce", "le1KiB"), ("broadcast", "le1MiB")):
                assert _get(samples, "pycoll_collective_errors_total", **lab,
                            collective=c, size_class=k) == 0
                assert _timed(samples, **lab, collective=c, size_class=k) <= CALLS
            # every call timed: measured, or a fast call by its successor's start; only the
            # job's last call (a broadcast) may wait for a successor it never has
            assert _timed(samples, **lab, collective="allreduce", size_class="le1KiB") == CALLS
            assert _timed(samples, **lab, collective="broadcast",
                          size_class="le1MiB") >= CALLS - 1
            assert _get(samples, "pycoll_collectives_numbered_total", **lab) >= 2 * CALLS
            assert _get(samples, "pycoll_communicator_failed", **lab) == 0
            again = _scrape(target)                # a second scrape counts nothing twice
            assert _get(again, "pycoll_collective_calls_total", **lab,
                        collective="broadcast", size_class="le1MiB") == CALLS
            print(f"rank {rank}: {len(samples)} samples")
        # what is not a scrape is answered, not served
        for request, code in ((b"POST /metrics HTTP/1.0\r\n\r\n", b"405"),
                              (b"GET /etc/passwd HTTP/1.0\r\n\r\n", b"404"),
                              (b"\x00\x01\x02 garbage\r\n\r\n", b"400")):
            with socket.create_connection(where[0], timeout=30) as s:
                s.sendall(request)
                assert s.recv(100).split()[1] == code, request
    finally:
        for s in held:
            s.close()
    _all_done(j.finish())


def test_metrics_are_off_by_default(job: Any, tmp_path: Path) -> None:
    start = tmp_path / "start"
    start.touch()
    j = job(2, script=JOB, CALLS=1, START=start, READY=tmp_path / "ready")
    for r in range(2):
        ready = tmp_path / f"ready.{r}"
        _wait_for(ready)
    host, port = j.address.rsplit(":", 1)
    with TCPStore(host, int(port), token=TOKEN, timeout=60) as store:
        assert not store.check([metrics_key("world", 0), metrics_key("world", 1)])
    _all_done(j.finish())


def _turn_the_ring(comm: Any) -> list[str]:
    import numpy as np
    x = np.ones(4, dtype=np.float32)
    for _ in range(30):
        comm.allreduce(x)
    where = comm._metrics.host, comm._metrics.port
    with urllib.request.urlopen(f"http://{where[0]}:{where[1]}/metrics", timeout=60) as r:
        first = r.read().decode()
    for _ in range(30):
        comm.allreduce(x)
    with urllib.request.urlopen(f"http://{where[0]}:{where[1]}/metrics", timeout=60) as r:
        return [first, r.read().decode()]


def test_calls_that_left_the_ring_are_counted_as_unrecorded() -> None:
    """A flight recorder of 10 records and 30 calls between scrapes: the calls it no longer
    holds are counted as unrecorded, and recorded + unrecorded is every call numbered."""
    from pycoll.testing import run_ranks
    for pages in run_ranks(_turn_the_ring, 2, env={"PYCOLL_METRICS_PORT": "0",
                                                   "PYCOLL_FLIGHT_RECORDER": "10"}):
        for page in pages:
            samples = {}
            for family in parser.text_string_to_metric_families(page):
                for s in family.samples:
                    samples[s.name + s.labels.get("collective", "")] = s.value
            recorded = samples["pycoll_collective_calls_totalallreduce"]
            # the histogram samples what the ring held: at most the calls it counted
            assert samples.get("pycoll_collective_latency_seconds_countallreduce", 0) \
                <= recorded
            assert recorded < samples["pycoll_collectives_numbered_total"]
            assert recorded + samples["pycoll_collectives_unrecorded_total"] \
                == samples["pycoll_collectives_numbered_total"], samples


def _small_fast_calls(comm: Any) -> dict[str, Any]:
    import numpy as np

    def scrape() -> str:
        where = comm._metrics.host, comm._metrics.port
        with urllib.request.urlopen(f"http://{where[0]}:{where[1]}/metrics",
                                    timeout=60) as r:
            return r.read().decode()
    x = np.ones(2, dtype=np.float32)       # 8 B
    took = time.monotonic()
    for _ in range(CALLS):
        comm.allreduce(x)
    took = time.monotonic() - took
    first = scrape()
    comm.barrier()                          # the last allreduce's successor
    return {"path": comm.selected_algorithm("allreduce", x.nbytes), "took": took,
            "ok": bool((x == comm.size ** CALLS).all()), "pages": [first, scrape()]}


def test_fast_path_calls_are_in_the_latency_histogram() -> None:
    """8 B allreduces on shm take the fast path, which reads the clock once per call (its
    start): each is timed at scrape time by the next call's start (``timing="next_call"``,
    an upper bound), the last one once its successor has started, and nothing is measured
    twice. Real rank processes, a real HTTP scrape, prometheus_client's parser."""
    from pycoll.testing import run_ranks
    for rank, got in enumerate(run_ranks(_small_fast_calls, 2,
                                         env={"PYCOLL_METRICS_PORT": "0",
                                              "PYCOLL_TRANSPORTS": "shm"})):
        assert got["path"] == "fastpath" and got["ok"], got
        lab = {"communicator": "world", "collective": "allreduce", "size_class": "le1KiB"}
        for scrape, timed in enumerate((CALLS - 1, CALLS)):
            samples = {}
            buckets = []
            for family in parser.text_string_to_metric_families(got["pages"][scrape]):
                for s in family.samples:
                    labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                          if k not in ("rank", "le")))
                    samples[(s.name, labels)] = s.value
                    if (s.name == "pycoll_collective_latency_seconds_bucket"
                            and s.labels.get("collective") == "allreduce"):
                        buckets.append(s.value)
            assert _get(samples, "pycoll_collective_calls_total", **lab) == CALLS
            assert _get(samples, "pycoll_collective_bytes_total", **lab) == CALLS * 8
            assert _timed(samples, "next_call", **lab) == timed, (rank, scrape)
            assert _timed(samples, "measured", **lab) == 0
            assert buckets == sorted(buckets) and buckets[-1] == timed     # +Inf: the count
            total = _get(samples, "pycoll_collective_latency_seconds_sum", **lab,
                         timing="next_call")
            # the bounds of the first CALLS - 1 calls lie inside the loop that made them
            if scrape == 0:
                assert 0 < total <= got["took"], (total, got["took"])
            print(f"rank {rank} scrape {scrape}: {int(timed)} fast allreduces timed, "
                  f"mean bound {total / timed * 1e6:.1f} us")
