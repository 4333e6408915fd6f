"""Buffers (numpy or torch) and the pycoll adapter for the benchmark runner."""
from __future__ import annotations

import os

import numpy as np

from .options import PT2PT
from .runner import BenchError


def cuda_unavailable_reason() -> str | None:
    """Why ``-d cuda`` cannot run in this process, as one line (None: it can).

    Asked before any rank starts and again on every rank before ``pycoll.init()``, so a
    machine without a GPU stops at once instead of failing inside a collective.
    """
    try:
        import torch
    except ImportError:
        return "-d cuda needs torch built with CUDA (torch is not installed); -d cpu works"
    if not torch.cuda.is_available():
        build = ("a CPU-only build" if getattr(torch.version, "cuda", None) is None
                 else f"CUDA {torch.version.cuda}; check the driver and CUDA_VISIBLE_DEVICES")
        return (f"-d cuda: no CUDA device is visible (torch {torch.__version__}, {build}); "
                "-d cpu works")
    try:
        from pycoll.cuda import runtime
    except ImportError:     # a pycoll without pycoll.cuda: its collectives say what is missing
        return None
    why = runtime.unavailable_reason()
    if why:
        return f"-d cuda: pycoll cannot use CUDA buffers here: {why}; -d cpu works"
    return None


def local_rank(env=None) -> int:
    """This process's rank on its host, from the launcher's variables (0 when none says)."""
    env = os.environ if env is None else env
    try:
        from pycoll.launch import detect_launch
        lr = detect_launch(env).local_rank
        if lr is not None:
            return int(lr)
    except Exception:   # noqa: BLE001 - init() reports a broken launch environment
        pass
    for var in ("PYCOLL_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                "MPI_LOCALRANKID", "SLURM_LOCALID"):
        try:
            return int(env[var])
        except (KeyError, ValueError):
            continue
    return 0


class NumpyBuffers:
    """numpy arrays on the host (pycoll's native buffers; mpi4py)."""

    def alloc(self, count: int, dtype: str):
        if dtype == "bfloat16":
            raise BenchError("bfloat16 needs torch tensors (numpy has no bfloat16)")
        return np.empty(count, dtype=dtype)

    def write(self, buf, arr):
        np.copyto(buf, arr, casting="unsafe")

    def read(self, buf):
        return buf

    def sync(self):
        pass


class TorchBuffers:
    """torch tensors on ``device`` ('cpu' or 'cuda'); bfloat16 read back as float32.

    ``cuda``: the tensors live on GPU ``local_rank % device_count`` (made the current device),
    and ``sync()`` is ``torch.cuda.synchronize()``.
    """

    def __init__(self, device: str = "cpu"):
        import torch
        self.torch = torch
        self.device = device
        self.device_index = None
        if device == "cuda":
            why = cuda_unavailable_reason()
            if why:
                raise BenchError(why)
            self.device_index = local_rank() % torch.cuda.device_count()
            torch.cuda.set_device(self.device_index)
            self.device = f"cuda:{self.device_index}"

    def alloc(self, count: int, dtype: str):
        return self.torch.empty(count, dtype=getattr(self.torch, dtype), device=self.device)

    def write(self, buf, arr):
        buf.copy_(self.torch.from_numpy(np.ascontiguousarray(arr)))

    def read(self, buf):
        t = buf.detach()
        if t.dtype == self.torch.bfloat16:
            t = t.float()
        return t.cpu().numpy()

    def sync(self):
        if self.device_index is not None:
            self.torch.cuda.synchronize()


class BufferDelegate:
    """Buffer handling every backend shares: it owns ``self.bufs`` (NumpyBuffers or
    TorchBuffers) and forwards to it, so a backend only says how to communicate."""

    bufs: NumpyBuffers | TorchBuffers

    def alloc(self, count, dtype):
        return self.bufs.alloc(count, dtype)

    def write(self, buf, arr):
        self.bufs.write(buf, arr)

    def read(self, buf):
        return self.bufs.read(buf)

    def sync(self):
        self.bufs.sync()


class PycollBackend(BufferDelegate):
    """Adapter from pycoll's module-level API to the runner's protocol."""

    name = "pycoll"
    #: the one-sided tests' windows (``-w``): ``allocate_window`` or ``window`` on a buffer
    window_type = "allocate"

    def __init__(self, device: str = "cpu", dtypes=("float32",)):
        import pycoll
        self.pc = pycoll
        self.version = getattr(pycoll, "__version__", "")
        if device == "cuda" or "bfloat16" in dtypes:
            # -d cuda: checked here, before pycoll.init(), so every rank stops at once
            self.bufs = TorchBuffers(device)
        else:
            self.bufs = NumpyBuffers()
        self.comm = pycoll.init()
        self.rank = int(pycoll.get_rank())
        self.world_size = int(pycoll.get_world_size())
        self._stats_cache: dict = {}

    # -- checks --------------------------------------------------------------
    def check_algo(self, collective: str, algo: str | None) -> None:
        """Reject an unknown --algo before any timing (the communicator names the choices)."""
        f = getattr(self.comm, "selected_algorithm", None)
        if not algo or f is None or collective == "barrier" or collective in PT2PT:
            return
        try:
            f(collective, 8, algo)
        except Exception as e:
            raise BenchError(str(e)) from None

    # -- operations ----------------------------------------------------------------------
    # The communicator's own methods, called as the MPI runner calls mpi4py's Comm (the
    # module-level functions add a lookup of the default communicator per call); no bound
    # method or partial is made per call: at 8 bytes that was a tenth of the time measured.
    def barrier(self):
        self.comm.barrier()

    def op(self, collective, bufs, op, root, algo, async_op=False):
        """One call; ``async_op=True`` (--nonblocking) returns its ``pycoll.Work``."""
        c = self.comm
        if collective == "allreduce":
            return c.allreduce(bufs["buf"], op, algo=algo, async_op=async_op)
        elif collective == "broadcast":
            return c.broadcast(bufs["buf"], root, algo=algo, async_op=async_op)
        elif collective == "reduce":
            return c.reduce(bufs["buf"], root, op, algo=algo, async_op=async_op)
        elif collective == "allgather":
            return c.allgather(bufs["out"], bufs["inp"], algo=algo, async_op=async_op)
        elif collective == "reduce_scatter":
            return c.reduce_scatter(bufs["out"], bufs["inp"], op, algo=algo, async_op=async_op)
        elif collective == "alltoall":
            return c.alltoall(bufs["out"], bufs["inp"], algo=algo, async_op=async_op)
        elif collective == "gather":
            return c.gather(bufs["out"], bufs["inp"], root, algo=algo, async_op=async_op)
        elif collective == "scatter":
            return c.scatter(bufs["out"], bufs["inp"], root, algo=algo, async_op=async_op)
        elif collective == "barrier":
            return c.barrier(algo=algo, async_op=async_op)
        raise BenchError(f"unknown collective {collective!r}")

    def send(self, buf, dst):
        self.comm.send(buf, dst)

    def recv(self, buf, src):
        self.comm.recv(buf, src)

    # -- one-sided (docs/windows.md): every operation completes before it returns, so there
    # is no epoch to open and flush only checks the window
    def window(self, buf):
        return self.comm.window(buf)

    def allocate_window(self, count, dtype):
        win = self.comm.allocate_window(count, np.dtype(dtype))
        return win, win.local

    def free_window(self, win):
        win.close()

    def lock(self, win, target):
        pass

    def unlock(self, win, target):
        pass

    def rma(self, kind, win, buf, target, offset):
        if kind == "put":
            win.put(buf, target, offset)
        elif kind == "get":
            win.get(buf, target, offset)
        else:
            win.accumulate(buf, target, offset)

    def flush(self, win, target):
        win.flush(target)

    def held_memory(self):
        """``Communicator.held_memory()`` (--memory); None from a pycoll without it."""
        f = getattr(self.comm, "held_memory", None)
        return f() if f is not None else None

    def allgather_floats(self, values):
        """Every rank's ``values`` as a (world_size, k) array, through a sum-allreduce."""
        k = len(values)
        a = np.zeros((self.world_size, k), dtype=np.float64)
        a[self.rank, :] = values
        # exact whatever --compress made the communicator's default
        self.comm.allreduce(a.reshape(-1), op="sum", compress="none")
        return a

    # -- description ---------------------------------------------------------
    def selected_algorithm(self, collective, nbytes, algo=None):
        if algo:
            return algo
        f = getattr(self.comm, "selected_algorithm", None)
        if f is None:
            return None
        try:
            return str(f(collective, int(nbytes)))
        except Exception:   # selection may not know a collective (barrier, pt2pt)
            return None

    def transport(self):
        f = getattr(self.comm, "transport_summary", None)
        if f is None:
            return os.environ.get("PYCOLL_TRANSPORTS") or None
        try:
            return str(f())
        except Exception as e:
            return f"unknown ({e})"

    def finalize(self):
        f = getattr(self.pc, "finalize", None)
        if f is not None:
            f()
