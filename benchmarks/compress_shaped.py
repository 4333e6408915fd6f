"""What compress= pays on slow links: 64 MiB float32 allreduce between 2 network-namespace
hosts with shaped links, uncompressed vs bf16 vs fp8 vs int8, and a DDP step with pycoll's
bf16 hook vs torch's ``bf16_compress_hook`` on Gloo (issue 44).

    python benchmarks/compress_shaped.py                       # 1gbit,10gbit and one host
    python benchmarks/compress_shaped.py --rates 1gbit --parts allreduce --reps 5
    python benchmarks/compress_shaped.py --rates 1gbit --parts ddp --hooks bf16,fp8,int8

Every case runs on the same kind of namespaces (``pycoll.testing.hosts``: 2 hosts x 1 rank,
each host's outgoing link shaped with tc tbf to the rate); ``local`` is 2 ranks on one host
(shm; where compression rarely pays). Per case, one job times each format on the same
communicator (median of ``--reps`` calls, each after a barrier). The DDP part trains an MLP
with about 16 M float32 parameters (64 MiB of gradients per step): median step time of
``--steps`` steps, pycoll backend + ``pycoll.torch.compressed_allreduce_hook`` (bf16, or each
format of ``--hooks``) vs gloo
backend + torch's ``bf16_compress_hook`` (its body: DDP refuses it by name without CUDA).
Prints a table of times and ratios (and JSON with ``--json``). Needs root, iproute2 (ip, tc)
and unshare; the namespaces are always removed. Numbers are only as good as the machine is
quiet: the codec passes are CPU work.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

FORMATS = ("none", "bf16", "fp8", "int8")
#: the DDP part's model: 4 x (2048 x 2048) linear layers, ~16.8 M parameters
WIDTH, DEPTH = 2048, 4


# -- the ranks ------------------------------------------------------------------------------
def allreduce_worker(nbytes: int, reps: int) -> None:
    import numpy as np

    import pycoll
    comm = pycoll.init()
    rng = np.random.default_rng(comm.rank)
    src = rng.standard_normal(nbytes // 4).astype(np.float32)
    buf = np.empty_like(src)
    out = {}
    for fmt in FORMATS:
        times = []
        for i in range(reps + 1):                    # the first: warm-up (scratch, codecs)
            buf[...] = src
            comm.barrier()
            t0 = time.perf_counter()
            comm.allreduce(buf, "sum", compress=fmt)
            if i:
                times.append(time.perf_counter() - t0)
        # every rank's time of a call is that of the slowest rank: rank 0's median stands
        out[fmt] = statistics.median(times)
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    comm.barrier()
    pycoll.finalize()


def ddp_worker(kind: str, steps: int) -> None:
    """``kind``: "gloo" (torch's bf16 hook) or "pycoll-FMT" (pycoll's hook in FMT)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import _compress_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pycoll.torch  # noqa: F401  (registers the backend)
    from pycoll.torch import CompressHookState, compressed_allreduce_hook
    torch.set_num_threads(1)
    dist.init_process_group("gloo" if kind == "gloo" else "pycoll")
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers))
    if kind != "gloo":
        model.register_comm_hook(CompressHookState(kind.split("-", 1)[1]),
                                 compressed_allreduce_hook)
    else:
        # torch's bf16_compress_hook is exactly this call; DDP refuses that hook *by name*
        # without CUDA and NCCL, though Gloo on CPU runs it. No annotations: DDP compares
        # them with the real classes, and this module's are strings.
        def torch_bf16_hook(state, bucket):  # type: ignore[no-untyped-def]
            return _compress_hook(torch.bfloat16, state, bucket)

        model.register_comm_hook(None, torch_bf16_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, WIDTH)
    times = []
    for i in range(steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({"step": statistics.median(times)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# -- the driver -----------------------------------------------------------------------------
def job(hosts: object, host_of: list[int], worker_args: list[str], timeout: float) -> dict:
    """This script's worker on 2 ranks, rank r on host ``host_of[r]``: rank 0's RESULT."""
    from multihost import _env

    from pycoll.testing import free_port
    from pycoll.testing.hosts import stop_group
    port = free_port()
    procs = []
    try:
        for r, h in enumerate(host_of):
            env = _env(RANK=str(r), WORLD_SIZE=str(len(host_of)), LOCAL_RANK=str(
                host_of[:r].count(h)), LOCAL_WORLD_SIZE=str(host_of.count(h)),
                MASTER_ADDR=hosts.addresses[0], MASTER_PORT=str(port),  # type: ignore[attr-defined]
                PYCOLL_TOKEN="compress-shaped", GLOO_SOCKET_IFNAME="eth0")
            argv = [sys.executable, str(Path(__file__).resolve()), "--worker", *worker_args]
            procs.append(hosts.popen(h, argv, env=env, stdout=subprocess.PIPE,  # type: ignore[attr-defined]
                                     stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
        for p, o in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError(f"worker failed ({p.returncode}): {o[-3000:]}")
        line = [ln for ln in outs[0].splitlines() if ln.startswith("RESULT ")]
        if not line:
            raise RuntimeError(f"rank 0 printed no RESULT: {outs[0][-3000:]}")
        return dict(json.loads(line[-1][len("RESULT "):]))
    finally:
        for p in procs:
            if p.poll() is None:
                stop_group(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1gbit,10gbit,local",
                    help="links to shape (tc tbf rates), 'local': 2 ranks on one host")
    ap.add_argument("--parts", default="allreduce,ddp")
    ap.add_argument("--mib", type=int, default=64, help="allreduce size in MiB of float32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed DDP steps")
    ap.add_argument("--hooks", default="bf16",
                    help="the formats of pycoll's DDP hook to run against Gloo's bf16 hook")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, *rest = args.worker
        if kind == "allreduce":
            allreduce_worker(int(rest[0]), int(rest[1]))
        else:
            ddp_worker(rest[0], int(rest[1]))
        return 0
    from pycoll.testing.hosts import NamespaceHosts, available
    ok, why = available()
    if not ok:
        print(f"namespace hosts unavailable: {why}", file=sys.stderr)
        return 2
    parts = args.parts.split(",")
    results: dict[str, dict] = {}
    for rate in args.rates.split(","):
        local = rate == "local"
        with NamespaceHosts(1 if local else 2, rate=None if local else rate) as hosts:
            host_of = [0, 0] if local else [0, 1]
            res: dict = {}
            if "allreduce" in parts:
                res["allreduce"] = job(hosts, host_of, ["allreduce", str(args.mib << 20),
                                                        str(args.reps)], 900)
            if "ddp" in parts:
                kinds = [f"pycoll-{f}" for f in args.hooks.split(",")] + ["gloo"]
                res["ddp"] = {k: job(hosts, host_of, ["ddp", k, str(args.steps)], 900)["step"]
                              for k in kinds}
            results[rate] = res
            print(f"{rate}: {json.dumps(res)}", flush=True)
    print()
    print(render(results, args.mib))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%F %T"), "mib": args.mib, "results": results}, f,
                      indent=1)
    return 0


def render(results: dict, mib: int) -> str:
    lines = [f"{mib} MiB float32 allreduce, 2 ranks (median s; speedup = uncompressed / fmt)",
             "| link | " + " | ".join(FORMATS) + " | " +
             " | ".join(f"{f} speedup" for f in FORMATS[1:]) + " |",
             "|---" * (2 * len(FORMATS)) + "|"]
    for rate, res in results.items():
        t = res.get("allreduce")
        if t:
            lines.append(f"| {rate} | " + " | ".join(f"{t[f]:.3f}" for f in FORMATS) + " | " +
                         " | ".join(f"{t['none'] / t[f]:.2f}x" for f in FORMATS[1:]) + " |")
    ddp = {rate: r["ddp"] for rate, r in results.items() if "ddp" in r}
    if ddp:
        hooks = [k for k in next(iter(ddp.values())) if k != "gloo"]
        lines += ["", f"DDP step, {DEPTH} x Linear({WIDTH}, {WIDTH}), 2 ranks (median s; "
                  "pycoll + compressed_allreduce_hook(FMT) vs gloo + bf16_compress_hook)",
                  "| link | " + " | ".join(hooks) + " | gloo | " +
                  " | ".join(f"gloo / {k}" for k in hooks) + " |",
                  "|---" * (2 * len(hooks) + 2) + "|"]
        for rate, d in ddp.items():
            lines.append(f"| {rate} | " + " | ".join(f"{d[k]:.3f}" for k in hooks) +
                         f" | {d['gloo']:.3f} | " +
                         " | ".join(f"{d['gloo'] / d[k]:.2f}x" for k in hooks) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
