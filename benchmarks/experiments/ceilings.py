"""Measure this machine's ceilings, to express pycoll's numbers as fractions of them.

* ``tcp``: one-way loopback TCP throughput between two Python processes
  (``sendall(memoryview)`` -> ``recv_into``), the bar for pycoll's TCP transport.
* ``memory``: aggregate copy bandwidth of two processes (``np.copyto``) at a given size,
  the ceiling of any shared-memory collective on one host.

Usage: ``python benchmarks/experiments/ceilings.py [--size 64M] [--reps 5]``; prints one
markdown row per ceiling (median of the repetitions). Run it in the same session as the benchmark it
normalises: this machine is shared and its numbers drift.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time

import numpy as np

from pycoll.bench.options import parse_size


def _tcp_receiver(port_q, nbytes: int, reps: int) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = memoryview(bytearray(nbytes))
    for _ in range(reps + 1):
        got = 0
        while got < nbytes:
            got += conn.recv_into(buf[got:])
        conn.sendall(b"k")
    conn.close()
    srv.close()


def tcp_one_way(nbytes: int, reps: int) -> float:
    """GB/s of one-way streaming over loopback between two processes (median of reps)."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_tcp_receiver, args=(q, nbytes, reps))
    p.start()
    try:
        sock = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = memoryview(np.ones(nbytes, dtype=np.uint8))
        rates = []
        for i in range(reps + 1):
            t = time.perf_counter()
            sock.sendall(data)
            sock.recv(1)
            if i:
                rates.append(nbytes / (time.perf_counter() - t) / 1e9)
        sock.close()
        return statistics.median(rates)
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()


def _copy_worker(nbytes: int, reps: int, start, out) -> None:
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)
    start.wait()
    t = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, src)
    out.put(nbytes * reps / (time.perf_counter() - t) / 1e9)


def memory_two_process(nbytes: int, reps: int) -> float:
    """Aggregate GB/s of buffer copied by two processes at once (np.copyto)."""
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_copy_worker, args=(nbytes, reps, start, out)) for _ in range(2)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="64M")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    nbytes = parse_size(args.size)
    print("| ceiling | size | GB/s |\n|---|---|---:|")
    print(f"| one-way loopback TCP, 2 processes | {args.size} | "
          f"{tcp_one_way(nbytes, args.reps):.2f} |")
    print(f"| memory copy, 2 processes aggregate | {args.size} | "
          f"{memory_two_process(nbytes, args.reps):.2f} |")


if __name__ == "__main__":
    main()
