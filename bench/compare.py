#!/usr/bin/env python3
"""pycoll side by side with torch.distributed (Gloo) and MPI (mpi4py on MPICH), in one run.

Every library is measured by the same timing loop (pycoll/bench/runner.py) on the same
collectives, sizes, dtype and world sizes.  Libraries are interleaved so that noise on this
shared machine hits all of them alike: ``--interleave rep`` (default) runs one sweep of all
sizes per (library, collective, world size) and rotates the library order every repetition;
``--interleave size`` starts one job per (library, size) and rotates per size (finer, slower
because of start-up).  Each point is the median over ``--reps`` repetitions.

Output in bench/results/<date>-<label>/: results.md (tables: latency, busbw, and the ratios
pycoll/Gloo and pycoll/MPI of busbw, i.e. >1 = pycoll faster), <collective>-n<N>.png (latency
and busbw against size, log axes), raw.jsonl (every row of every repetition), machine.json.

Quick smoke run:   python bench/compare.py --sizes 8:16M --ranks 2 --collectives allreduce
Full report:       python bench/compare.py --preset full --label report
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from pycoll.bench.options import format_size, message_sizes, parse_message_range  # noqa: E402

LIBS = ("pycoll", "gloo", "mpi")
PRESETS = {
    "quick": {"sizes": "8:16M", "ranks": "2", "collectives": "allreduce", "reps": 1,
              "time_budget": 0.3},
    "full": {"sizes": "8:512M", "ranks": "2,4", "collectives": "allreduce,broadcast",
             "reps": 3, "time_budget": 1.0},
}


# ---------------------------------------------------------------------------
# machine description
# ---------------------------------------------------------------------------
def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cmd(args, timeout=20):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_description(py: str) -> dict:
    cpu = ""
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    versions = _cmd([py, "-c", (
        "import json, platform, numpy\n"
        "v = {'python': platform.python_version(), 'numpy': numpy.__version__}\n"
        "try:\n import pycoll; v['pycoll'] = pycoll.__version__\n"
        "except Exception as e: v['pycoll'] = 'unavailable: %s' % e\n"
        "try:\n import torch; v['torch'] = torch.__version__\n"
        "except Exception as e: v['torch'] = 'unavailable'\n"
        "try:\n import mpi4py; v['mpi4py'] = mpi4py.__version__\n"
        " from mpi4py import MPI; v['mpi'] = ' '.join(MPI.Get_library_version().split()[:3])\n"
        "except Exception as e: v['mpi4py'] = 'unavailable'\n"
        "print(json.dumps(v))")])
    try:
        versions = json.loads(versions.splitlines()[-1])
    except (ValueError, IndexError):
        versions = {}
    return {
        "host": socket.gethostname(), "nproc": os.cpu_count(),
        "memory_GiB": round(mem_kb / 2**20, 1), "cpu": cpu or platform.processor(),
        "kernel": platform.release(), "loadavg_start": os.getloadavg(),
        "git": _cmd(["git", "rev-parse", "--short", "HEAD"]) or "no commit",
        "git_dirty": bool(_cmd(["git", "status", "--porcelain", "--untracked-files=no"])),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        **versions,
    }


# ---------------------------------------------------------------------------
# running one job
# ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_mpiexec(py: str) -> str | None:
    cand = os.path.join(os.path.dirname(py), "mpiexec")
    if os.path.exists(cand):
        return cand
    return shutil.which("mpiexec")


def available(lib: str, py: str) -> str | None:
    """None if ``lib`` can run, else the reason it cannot."""
    if lib == "pycoll":
        r = subprocess.run([py, "-c", "import pycoll, pycoll.launch"], capture_output=True,
                           text=True)
        return None if r.returncode == 0 else f"pycoll not importable: {r.stderr.strip()[-200:]}"
    if lib == "gloo":
        r = subprocess.run([py, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                           capture_output=True, text=True)
        return None if r.returncode == 0 else "torch with Gloo is not installed"
    if lib == "mpi":
        r = subprocess.run([py, "-c", "import mpi4py.MPI"], capture_output=True, text=True)
        if r.returncode != 0:
            return "mpi4py is not installed (pip install mpich mpi4py)"
        if find_mpiexec(py) is None:
            return "mpiexec not found (pip install mpich)"
        return None
    return f"unknown library {lib!r}"


def _common_args(a, coll: str, sizes: str) -> list[str]:
    args = ["-m", sizes, "-T", a.dtype, "-o", a.op]
    if a.time_budget:
        args += ["--time-budget", str(a.time_budget), "--min-iterations", str(a.min_iterations)]
    if a.iterations:
        args += ["-i", str(a.iterations)]
    if a.warmup is not None:
        args += ["-x", str(a.warmup)]
    if a.validate:
        args += ["-c"]
    return args


UNSUPPORTED_MARKERS = ("not available in this pycoll version", "has no ")


def _unsupported(err: str) -> bool:
    """A library that lacks the collective/op/dtype (reported, not an error)."""
    return any(m in err for m in UNSUPPORTED_MARKERS)


def run_job(a, py: str, lib: str, coll: str, n: int, sizes: str) -> tuple[list[dict], str]:
    """Run one (library, collective, world size) sweep; return (rows, error text)."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    common = _common_args(a, coll, sizes)
    procs = []
    if lib == "pycoll":
        cmd = [py, "-m", "pycoll.bench", coll, "-n", str(n), "--format", "jsonl", "-q", *common]
        if a.transport:
            cmd += ["--transport", a.transport]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    elif lib == "gloo":
        port = free_port()
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n),
                    "LOCAL_WORLD_SIZE": str(n), "GLOO_SOCKET_IFNAME": "lo"})
        env.setdefault("OMP_NUM_THREADS", "1")      # what torchrun sets for nproc > 1
        for r in range(n):
            e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
            cmd = [py, os.path.join(HERE, "peers", "gloo_runner.py"), "--collectives", coll,
                   *common]
            procs.append(subprocess.Popen(
                cmd, cwd=ROOT, env=e, stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True))
    elif lib == "mpi":
        env.setdefault("UCX_TLS", "self,sm")
        cmd = [find_mpiexec(py), "-launcher", "fork", "-hosts", "127.0.0.1", "-n", str(n),
               py, os.path.join(HERE, "peers", "mpi_runner.py"), "--collectives", coll, *common]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    else:
        raise ValueError(lib)
    deadline = time.monotonic() + a.job_timeout
    outs = []
    err = ""
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, e = p.communicate()
            err += f"timed out after {a.job_timeout:.0f} s; "
        outs.append(o or "")
        if p.returncode not in (0, None):
            err += f"exit {p.returncode}: {(e or '').strip()[-400:]}; "
    rows = []
    for line in outs[0].splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "meta" in d:
            continue
        if "error" in d:
            err += d["error"] + "; "
            continue
        d["library"] = lib
        rows.append(d)
    return rows, err.strip("; ")


# ---------------------------------------------------------------------------
# aggregation and report
# ---------------------------------------------------------------------------
def aggregate(rows: list[dict]) -> dict:
    """(collective, n, lib, size) -> {'lat': median us, 'bw': median busbw, 'reps': k, ...}."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["collective"], r["ranks"], r["library"], r["size"]), []).append(r)
    out = {}
    for k, rs in groups.items():
        lats = [r["avg_us"] for r in rs]
        bws = [r["busbw_GBps"] for r in rs]
        out[k] = {"lat": statistics.median(lats), "lat_best": min(lats),
                  "bw": statistics.median(bws), "bw_best": max(bws), "reps": len(rs),
                  "spread": (max(lats) - min(lats)) / min(lats) if min(lats) > 0 else 0.0,
                  "validation": sorted({r.get("validation") for r in rs if r.get("validation")})}
    return out


def _fmt_lat(v):
    if v is None:
        return "–"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _fmt_bw(v):
    if v is None:
        return "–"
    return f"{v:.3g}"


def _fmt_ratio(a, b):
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}x"


def markdown(a, machine: dict, agg: dict, libs: list[str], skipped: dict, errors: list[str],
             plots: dict, elapsed: float) -> str:
    L = []
    L.append(f"# pycoll vs Gloo vs MPI — {machine['date']}" + (f" ({a.label})" if a.label else ""))
    L.append("")
    L.append("## Machine")
    L.append("")
    L.append(f"- host `{machine['host']}`: {machine['nproc']} CPUs ({machine['cpu']}), "
             f"{machine['memory_GiB']} GiB memory, Linux {machine['kernel']}")
    L.append(f"- load average at start {tuple(round(x, 2) for x in machine['loadavg_start'])}, "
             f"at end {tuple(round(x, 2) for x in machine.get('loadavg_end', (0, 0, 0)))}")
    L.append(f"- Python {machine.get('python')}, numpy {machine.get('numpy')}, "
             f"pycoll {machine.get('pycoll')} (git {machine['git']}"
             f"{', uncommitted changes' if machine.get('git_dirty') else ''}), "
             f"torch {machine.get('torch')}, mpi4py {machine.get('mpi4py')} on {machine.get('mpi')}")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append(f"- Command: `{' '.join(a.argv)}` ({elapsed / 60:.1f} min)")
    L.append(f"- dtype {a.dtype}, op {a.op}; sizes {a.sizes} (nccl-tests convention: bytes of "
             f"the whole buffer); {a.reps} repetition(s), libraries interleaved per "
             f"{'repetition (order rotated)' if a.interleave == 'rep' else 'size'}; each cell is "
             f"the median over repetitions.")
    it = (f"OSU iteration counts (1000/100 up to 8 KiB, 100/10 above)"
          + (f", capped so one size takes about {a.time_budget} s (at least "
             f"{a.min_iterations} iterations)" if a.time_budget else ""))
    L.append(f"- Timing: the same loop for every library (pycoll/bench/runner.py): each op timed, "
             f"untimed barrier after it; {it}; latency = mean over ranks of the per-rank mean.")
    L.append("- busbw in GB/s (1e9 B): allreduce algbw × 2(n−1)/n, broadcast algbw × 1. "
             "Ratio columns are pycoll busbw / peer busbw (= peer latency / pycoll latency): "
             "above 1 means pycoll is faster.")
    L.append("- Peers: Gloo = torch.distributed `gloo` over `tcp://127.0.0.1` "
             "(`GLOO_SOCKET_IFNAME=lo`, OMP_NUM_THREADS=1 as torchrun sets); MPI = mpi4py on the "
             "`mpich` wheel, `UCX_TLS=self,sm mpiexec -launcher fork -hosts 127.0.0.1`; in-place "
             "operations everywhere.")
    if a.transport:
        L.append(f"- pycoll transport forced: {a.transport}")
    for lib, why in skipped.items():
        L.append(f"- **{lib} not measured**: {why}")
    L.append("")
    colls = sorted({k[0] for k in agg}, key=lambda c: a.collectives.index(c)
                   if c in a.collectives else 99)
    for coll in colls:
        for n in sorted({k[1] for k in agg if k[0] == coll}):
            L.append(f"## {coll}, {n} ranks")
            L.append("")
            if (coll, n) in plots:
                L.append(f"![{coll} n={n}]({os.path.basename(plots[(coll, n)])})")
                L.append("")
            head = ["size"] + [f"{lib} lat (us)" for lib in libs] + \
                   [f"{lib} busbw (GB/s)" for lib in libs] + \
                   [f"pycoll/{lib}" for lib in libs if lib != "pycoll" and "pycoll" in libs]
            L.append("| " + " | ".join(head) + " |")
            L.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
            sizes = sorted({k[3] for k in agg if k[0] == coll and k[1] == n})
            for s in sizes:
                cells = {lib: agg.get((coll, n, lib, s)) for lib in libs}
                row = [format_size(s)]
                row += [_fmt_lat(c["lat"]) if c else "–" for c in cells.values()]
                row += [_fmt_bw(c["bw"]) if c else "–" for c in cells.values()]
                pc = cells.get("pycoll")
                for lib in libs:
                    if lib == "pycoll" or "pycoll" not in libs:
                        continue
                    c = cells.get(lib)
                    row.append(_fmt_ratio(pc["bw"] if pc else None, c["bw"] if c else None)
                               if s > 0 else _fmt_ratio(c["lat"] if c else None,
                                                        pc["lat"] if pc else None))
                L.append("| " + " | ".join(row) + " |")
            L.append("")
    fails = sorted({(k[0], k[1], k[2]) for k, v in agg.items() if "Fail" in v["validation"]})
    if fails:
        L.append("## Validation failures")
        L.append("")
        for f in fails:
            L.append(f"- {f[2]} {f[0]} n={f[1]}")
        L.append("")
    if errors:
        L.append("## Errors")
        L.append("")
        for e in errors:
            L.append(f"- {e}")
        L.append("")
    spreads = [v["spread"] for v in agg.values() if v["reps"] > 1]
    if spreads:
        L.append(f"Repetition spread (max−min)/min of latency: median "
                 f"{statistics.median(spreads) * 100:.0f}%, "
                 f"{sum(1 for s in spreads if s > 0.5)} of {len(spreads)} points above 50%.")
        L.append("")
    return "\n".join(L)


def make_plots(outdir: str, agg: dict, libs: list[str]) -> dict:
    try:
        from pycoll.bench.plot import plot_series
    except Exception:
        return {}
    plots = {}
    for coll, n in sorted({(k[0], k[1]) for k in agg}):
        series = {}
        for lib in libs:
            pts = [(k[3], v["lat"], v["bw"]) for k, v in agg.items()
                   if k[0] == coll and k[1] == n and k[2] == lib]
            if pts:
                series[lib] = pts
        path = os.path.join(outdir, f"{coll}-n{n}.png")
        try:
            plot_series(series, path, title=f"{coll}, {n} ranks (median of repetitions)")
        except RuntimeError as e:
            print(f"compare: no plots: {e}", file=sys.stderr)
            return plots
        plots[(coll, n)] = path
    return plots


# ---------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="quick: 8:16M, 2 ranks, allreduce, 1 rep; full: 8:512M, 2 and 4 "
                        "ranks, allreduce+broadcast, 3 reps (explicit flags override)")
    p.add_argument("--sizes", default=None, help="[MIN:]MAX (default 8:16M)")
    p.add_argument("--ranks", default=None, help="comma-separated world sizes (default 2)")
    p.add_argument("--collectives", default=None, help="default allreduce,broadcast")
    p.add_argument("--libs", default="pycoll,gloo,mpi")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3)")
    p.add_argument("--interleave", choices=("rep", "size"), default="rep")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds per size per library (default 1.0; 0 = OSU counts uncapped)")
    p.add_argument("--min-iterations", type=int, default=5)
    p.add_argument("-i", "--iterations", type=int, default=None)
    p.add_argument("-x", "--warmup", type=int, default=None)
    p.add_argument("-T", "--dtype", default="float32")
    p.add_argument("-o", "--op", default="sum")
    p.add_argument("-c", "--validate", action="store_true", help="validate every result")
    p.add_argument("--transport", default=None, help="force pycoll's transport (tcp|shm)")
    p.add_argument("--label", default="adhoc", help="results folder suffix")
    p.add_argument("--out", default=os.path.join(HERE, "results"),
                   help="parent folder (default bench/results)")
    p.add_argument("--python", default=sys.executable, help="interpreter for every job")
    p.add_argument("--job-timeout", type=float, default=1800.0,
                   help="seconds before one job is killed (default 1800)")
    a = p.parse_args(argv)
    preset = PRESETS.get(a.preset, {})
    a.sizes = a.sizes or preset.get("sizes", "8:16M")
    a.ranks = [int(x) for x in str(a.ranks or preset.get("ranks", "2")).split(",") if x]
    a.collectives = [c.strip() for c in
                     (a.collectives or preset.get("collectives", "allreduce,broadcast")).split(",")
                     if c.strip()]
    a.reps = a.reps if a.reps is not None else preset.get("reps", 3)
    if a.time_budget is None:
        a.time_budget = preset.get("time_budget", 1.0)
    a.time_budget = a.time_budget or None
    a.libs = [x.strip() for x in a.libs.split(",") if x.strip()]
    for lib in a.libs:
        if lib not in LIBS:
            p.error(f"unknown library {lib!r}; choose from {', '.join(LIBS)}")
    a.argv = ["python", "bench/compare.py", *(sys.argv[1:] if argv is None else argv)]
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    py = a.python
    t_start = time.monotonic()
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    outdir = os.path.join(a.out, f"{stamp}-{a.label}")
    os.makedirs(outdir, exist_ok=True)
    machine = machine_description(py)
    skipped = {}
    libs = []
    for lib in a.libs:
        why = available(lib, py)
        if why:
            skipped[lib] = why
            print(f"compare: skipping {lib}: {why}", file=sys.stderr)
        else:
            libs.append(lib)
    if not libs:
        print("compare: no library can run", file=sys.stderr)
        return 2
    mn, mx = parse_message_range(a.sizes, 8, 16 << 20)
    all_sizes = message_sizes(mn, mx)
    if a.interleave == "rep":
        size_chunks = [f"{mn}:{mx}"]
    else:
        size_chunks = [f"{s}:{s}" for s in all_sizes]
    rows: list[dict] = []
    errors: list[str] = []
    unsupported: dict = {}
    raw_path = os.path.join(outdir, "raw.jsonl")
    job = 0
    with open(raw_path, "w") as raw:
        for rep in range(a.reps):
            for n in a.ranks:
                for coll in a.collectives:
                    for ci, chunk in enumerate(size_chunks):
                        k = (rep + ci) % len(libs)
                        order = libs[k:] + libs[:k]
                        for lib in order:
                            job += 1
                            t0 = time.monotonic()
                            got, err = run_job(a, py, lib, coll, n, chunk)
                            dtj = time.monotonic() - t0
                            print(f"compare: rep {rep + 1}/{a.reps} n={n} {coll} {lib} "
                                  f"{chunk}: {len(got)} rows in {dtj:.1f} s"
                                  + (f" ERROR {err}" if err else ""), file=sys.stderr,
                                  flush=True)
                            if err and not got and _unsupported(err):
                                unsupported.setdefault((lib, coll), err)
                            elif err:
                                errors.append(f"rep {rep + 1} {lib} {coll} n={n} {chunk}: {err}")
                            for r in got:
                                r["rep"] = rep
                                raw.write(json.dumps(r, sort_keys=True) + "\n")
                            raw.flush()
                            rows.extend(got)
    machine["loadavg_end"] = os.getloadavg()
    agg = aggregate(rows)
    plots = make_plots(outdir, agg, libs)
    for (lib, coll), why in unsupported.items():
        line = next((ln for ln in why.splitlines() if _unsupported(ln)), why.splitlines()[0])
        skipped[f"{lib} {coll}"] = line.split(": ", 1)[-1].strip("; ")
    md = markdown(a, machine, agg, libs, skipped, errors, plots, time.monotonic() - t_start)
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(outdir, "machine.json"), "w") as f:
        json.dump(machine, f, indent=1, sort_keys=True)
    print(md)
    print(f"\ncompare: results in {os.path.relpath(outdir, ROOT)}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
