"""Cross-memory attach and process liveness: reading and writing a same-host peer's memory
(``process_vm_readv``/``process_vm_writev``, as MPICH and Open MPI do) and telling whether
the peer's process is gone. Used by the shm transport's rendezvous and one-sided puts, by
the fast path's single-copy kernels (which call the system calls themselves) and by anything
that must tell a dead local peer from a slow one.
"""
from __future__ import annotations

import ctypes
import os

from ...buffers.memory import view_address
from ...errors import TransportError
from ..base import peer_lost

_libc = ctypes.CDLL(None, use_errno=True)


#: ``PF_EXITING`` in the flags of ``/proc/<pid>/stat``: the process is being torn down
_PF_EXITING = 0x4


def process_exited(pid: int) -> bool:
    """Whether process ``pid`` is gone, a zombie (killed, not yet reaped by its parent) or
    exiting (its memory may already be gone while its state still says running: a read of
    it that failed is then the peer's death, not a refusal).

    Read from ``/proc/<pid>/stat``; where that is hidden (``hidepid``) a signal 0 decides,
    and a process that is not ours to signal counts as running.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:      # bytes: a name may be any bytes
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)
    except (IndexError, ValueError):
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def cma_read(pid: int, remote_address: int, view: memoryview, peer: int,
             write: bool = False) -> None:
    """Copy ``len(view)`` bytes from ``remote_address`` in process ``pid`` into ``view``
    (``write``: from ``view`` to the remote address instead)."""
    total = view.nbytes
    if total == 0:
        return
    local = view_address(view)
    call = _libc.process_vm_writev if write else _libc.process_vm_readv
    done = 0
    while done < total:
        liov = _IoVec(local + done, total - done)
        riov = _IoVec(remote_address + done, total - done)
        n = call(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
        if n <= 0:
            err = ctypes.get_errno()
            if err == 3 or process_exited(pid):  # ESRCH, or a dying process's memory is gone
                raise peer_lost(peer, f"process {pid} exited during a shared-memory copy")
            raise TransportError(f"{'process_vm_writev to' if write else 'process_vm_readv from'}"
                                 f" peer rank {peer} (pid {pid}) failed: {os.strerror(err)}",
                                 peer=peer)
        done += n
