"""Platform facts that pycoll's CUDA design rests on, measured without pycoll's transports.

Run by tools/gpu_checks.sh on the GPU machine (``python3 tools/gpu/probe.py``). Prints:

1. whether a thread that never touched CUDA has a current context (pycoll's worker thread
   makes raw driver calls, which need one), before and after making the device current;
2. legacy CUDA IPC between two processes on the same GPU, of a buffer at an offset inside
   one torch caching-allocator block (how pycoll maps a peer's tensor), with an IPC event;
3. the device copy ceiling that every bound in the CUDA issue is derived from.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import threading

GIB = 1 << 30


def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                            ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
    return lib


def address_range(ptr: int) -> tuple[int, int, int]:
    """(CUresult, base, size) of the allocation holding ``ptr``."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = _driver().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr)
    return rc, base.value, size.value


def fresh_thread(ptr: int, out: list) -> None:
    lib = _driver()
    ctx = ctypes.c_void_p()
    lib.cuCtxGetCurrent(ctypes.byref(ctx))
    out.append(("context before any runtime call", ctx.value))
    out.append(("cuMemGetAddressRange before", address_range(ptr)[0]))
    import cupy as cp
    with cp.cuda.Device(0):
        lib.cuCtxGetCurrent(ctypes.byref(ctx))
        out.append(("context inside `with cp.cuda.Device(0)`", ctx.value))
    cp.cuda.runtime.setDevice(0)
    lib.cuCtxGetCurrent(ctypes.byref(ctx))
    out.append(("context after cudaSetDevice(0)", ctx.value))
    out.append(("cuMemGetAddressRange after", address_range(ptr)[0]))


def child(q, handle, event_handle, offset, n):
    import cupy as cp
    cp.cuda.runtime.setDevice(0)
    base = cp.cuda.runtime.ipcOpenMemHandle(handle)
    event = cp.cuda.runtime.ipcOpenEventHandle(event_handle)
    dst = cp.empty(n, cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.streamWaitEvent(stream.ptr, event, 0)
    a, b = cp.cuda.Event(), cp.cuda.Event()
    for i in range(4):
        if i == 1:
            a.record(stream)
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, base + offset, n, 3, stream.ptr)
    b.record(stream)
    b.synchronize()
    rate = 3 * n / (cp.cuda.get_elapsed_time(a, b) / 1e3) / 1e9
    q.put((int(dst[:1024].sum()), int(dst[-1]), rate))
    cp.cuda.runtime.ipcCloseMemHandle(base)


def main() -> None:
    import cupy as cp
    import torch
    n = GIB
    block = torch.full((n + 4096,), 7, dtype=torch.uint8, device="cuda")
    t = block[4096:]                     # an interior pointer of one allocator block
    torch.cuda.synchronize()

    out: list = []
    th = threading.Thread(target=fresh_thread, args=(t.data_ptr(), out))
    th.start()
    th.join()
    for what, value in out:
        print(f"fresh thread: {what}: {value}", flush=True)

    rc, base, size = address_range(t.data_ptr())
    print(f"main thread: cuMemGetAddressRange rc={rc} offset={t.data_ptr() - base} size={size}",
          flush=True)
    handle = cp.cuda.runtime.ipcGetMemHandle(base)
    event = cp.cuda.Event(block=False, disable_timing=True, interprocess=True)
    cp.cuda.runtime.eventRecord(event.ptr, torch.cuda.current_stream().cuda_stream)
    event_handle = cp.cuda.runtime.ipcGetEventHandle(event.ptr)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q, handle, event_handle, t.data_ptr() - base, n))
    p.start()
    got = q.get(timeout=90)
    p.join(20)
    print(f"IPC same GPU, at an offset in a torch block: data ok="
          f"{got[0] == 7 * 1024 and got[1] == 7}; 1 GiB copied from the peer's mapping at "
          f"{got[2]:.0f} GB/s (bytes copied per second)", flush=True)

    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        dst.copy_(src)
    b.record()
    b.synchronize()
    rate = 10 * n / (a.elapsed_time(b) / 1e3) / 1e9
    print(f"COPY CEILING torch d2d 1 GiB: {rate:.0f} GB/s copied = {2 * rate:.0f} GB/s read+write",
          flush=True)
    for ranks in (2, 4):
        bound = (ranks - 1) / ranks ** 2 * 2 * rate
        print(f"ONE-MEMORY BOUND allreduce busbw at n={ranks}: (n-1)/n^2 x read+write = "
              f"{bound:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
