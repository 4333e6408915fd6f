"""Bootstrap benchmark: rendezvous.TCPStore vs torch.distributed.TCPStore.

The pattern every pycoll job starts with: each of N clients connects, sets its own address
key, then ``multi_get``s all N address keys. We measure the wall time from "go" until the last
client holds every address (connection setup included, process/thread start-up excluded).

Clients are spread over ``--procs`` worker processes, each driving its share of clients with
one thread per client. Both stores' servers run inside this (the bench) process: rendezvous'
StoreServer on a background thread, torch's as ``is_master=True``.

    python benchmarks/bench_rendezvous.py                    # N = 64, 256, 1024
    python benchmarks/bench_rendezvous.py --sizes 64,256 --procs 4 --repeat 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import threading
import time
from datetime import timedelta

HOST = "127.0.0.1"


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _make_client(backend: str, port: int, timeout: float):
    if backend == "rendezvous":
        import rendezvous

        return rendezvous.TCPStore(HOST, port, timeout=timeout)
    import torch.distributed as dist

    return dist.TCPStore(
        HOST, port, world_size=None, is_master=False,
        timeout=timedelta(seconds=timeout), wait_for_workers=False,
    )


def _worker(backend: str, port: int, n: int, ranks: list[int], ready, go1, go2, results) -> None:
    """One worker process: one thread per client rank.

    Phase 1 (released by ``go1``): every thread connects. Phase 2 (``go2``, once every client
    in every worker is connected): set own address, ``multi_get`` all addresses.
    """
    _raise_nofile()
    threading.stack_size(256 * 1024)
    if backend == "torch":
        import torch.distributed  # noqa: F401  (import before timing starts)
    else:
        import rendezvous  # noqa: F401
    keys = [f"addr/{r}" for r in range(n)]
    start1, start2, all_connected = threading.Event(), threading.Event(), threading.Event()
    finish: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    connected = [0]
    clients = []

    def run(rank: int) -> None:
        store = None
        start1.wait()
        try:
            store = _make_client(backend, port, 120.0)
        except Exception as e:
            with lock:
                errors.append(f"rank {rank} connect: {e!r}")
        finally:
            with lock:
                connected[0] += 1
                if connected[0] == len(ranks):
                    all_connected.set()
        if store is None:
            return
        start2.wait()
        try:
            addr = f"tcp://10.0.{rank // 256}.{rank % 256}:{20000 + rank}"
            store.set(keys[rank], addr)
            values = store.multi_get(keys)
            t = time.monotonic()
            if len(values) != n or values[rank] != addr.encode():
                raise RuntimeError("wrong values")
            with lock:
                finish.append(t)
                clients.append(store)  # keep connected until everyone is done
        except Exception as e:  # report, never hang the bench
            with lock:
                errors.append(f"rank {rank}: {e!r}")

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    ready.put(os.getpid())
    go1.wait()
    start1.set()
    all_connected.wait(180)
    results.put(("connected", time.monotonic()))
    go2.wait(180)
    start2.set()
    for t in threads:
        t.join(180)
    results.put(("done", max(finish) if finish else None, len(finish), errors[:3]))
    for c in clients:
        try:
            c.close() if hasattr(c, "close") else None
        except Exception:
            pass


def _start_server(backend: str):
    if backend == "rendezvous":
        import rendezvous

        srv = rendezvous.StoreServer(HOST, 0, token="").start()
        return srv, srv.port
    import torch.distributed as dist

    master = dist.TCPStore(HOST, 0, world_size=None, is_master=True,
                           timeout=timedelta(seconds=120), wait_for_workers=False)
    return master, master.port


def _stop_server(backend: str, srv) -> None:
    if backend == "rendezvous":
        srv.close()
    else:
        del srv


def run_once(backend: str, n: int, procs: int) -> tuple[float, float]:
    """Return (connect seconds, exchange seconds) for one bootstrap of ``n`` clients."""
    ctx = mp.get_context("spawn")
    srv, port = _start_server(backend)
    ready, results, go1, go2 = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    procs = max(1, min(procs, n))
    shares = [list(range(i, n, procs)) for i in range(procs)]
    workers = [ctx.Process(target=_worker, args=(backend, port, n, s, ready, go1, go2, results),
                           daemon=True)
               for s in shares]
    try:
        for w in workers:
            w.start()
        for _ in workers:
            ready.get(timeout=120)
        t0 = time.monotonic()
        go1.set()
        t1 = max(results.get(timeout=240)[1] for _ in workers)
        t2 = time.monotonic()
        go2.set()
        outs = [results.get(timeout=240) for _ in workers]
    finally:
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()
                w.join(10)
        _stop_server(backend, srv)
    done = sum(o[2] for o in outs)
    errs = [e for o in outs for e in o[3]]
    if done != n:
        raise RuntimeError(f"{backend} N={n}: only {done}/{n} clients finished; e.g. {errs}")
    return t1 - t0, max(o[1] for o in outs) - t2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,1024", help="comma-separated client counts")
    ap.add_argument("--procs", type=int, default=4, help="worker processes driving the clients")
    ap.add_argument("--repeat", type=int, default=3, help="runs per point; the median is reported")
    ap.add_argument("--no-torch", action="store_true", help="skip torch even if importable")
    args = ap.parse_args(argv)
    _raise_nofile()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    backends = ["rendezvous"]
    if not args.no_torch:
        try:
            import torch.distributed as dist  # noqa: F401

            if dist.is_available():
                backends.append("torch")
        except Exception:
            pass
    rows = []
    for n in sizes:
        med = {}
        for b in backends:
            runs = [run_once(b, n, args.procs) for _ in range(args.repeat)]
            conn = statistics.median(r[0] for r in runs)
            exch = statistics.median(r[1] for r in runs)
            total = statistics.median(r[0] + r[1] for r in runs)
            med[b] = (total, conn, exch)
            print(f"# {b:10s} N={n:5d} (connect, exchange) runs: "
                  + ", ".join(f"({c:.3f}, {x:.3f})" for c, x in runs), file=sys.stderr, flush=True)
        rows.append((n, med.get("rendezvous"), med.get("torch")))

    def cell(v):
        return f"{v[0]:.3f} ({v[1]:.3f} + {v[2]:.3f})" if v else "n/a"

    print("\nbootstrap = connect + (set own address, multi_get all N); "
          f"{args.procs} worker processes; "
          f"median of {args.repeat}; python {sys.version.split()[0]}; {os.cpu_count()} cpus")
    print("\n| N | rendezvous s (connect + exchange) | torch TCPStore s (connect + exchange) "
          "| ratio total | ratio exchange |")
    print("|---:|---:|---:|---:|---:|")
    for n, r, t in rows:
        ratio = f"{r[0] / t[0]:.2f}" if t else "n/a"
        xratio = f"{r[2] / t[2]:.2f}" if t else "n/a"
        print(f"| {n} | {cell(r)} | {cell(t)} | {ratio} | {xratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
