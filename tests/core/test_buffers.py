"""Buffers in: every object kind a user may pass, classified, validated and routed.

Host objects (numpy, torch CPU, bytearray, memoryview, array.array, anything with
``__dlpack__`` on the CPU) work end to end. Device objects (``__cuda_array_interface__``,
DLPack on a CUDA device) are classified with their device and refused with a clear error on
every rank before any byte moves: nothing is ever copied to the host silently.
"""
from __future__ import annotations

import array

import numpy as np
import pytest

from pycoll.buffers.memory import CUDA, HOST, MemRef
from pycoll.buffers.tensors import as_buffer
from pycoll.errors import InvalidArgument
from pycoll.testing import run_ranks


class DLPackOnly:
    """Exposes a numpy array through DLPack only (as a CPU tensor of another library does)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, *args, **kwargs):
        return self._arr.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


class DeviceArray:
    """An object speaking the CUDA Array Interface (v3), as cupy and numba arrays do.

    Its pointer is never dereferenced: device buffers are refused before any byte moves.
    """

    def __init__(self, shape, typestr="<f4", strides=None, device=0):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (0x1000, False),
                                         "version": 3, "strides": strides}
        self.device = type("Device", (), {"id": device})()


def _host_kinds(comm):
    r = comm.rank
    out = {}
    ba = bytearray([r + 1] * 8)
    comm.allreduce(ba, op="max")
    out["bytearray"] = list(ba)
    mv = memoryview(bytearray(16)).cast("i")
    mv[0] = r + 1
    comm.allreduce(mv)
    out["memoryview"] = mv[0]
    arr = array.array("d", [r + 0.5] * 3)
    comm.allreduce(arr)
    out["array.array"] = list(arr)
    np_arr = np.full(5, r + 1, dtype=np.float32)
    comm.broadcast(DLPackOnly(np_arr), root=1)
    out["dlpack"] = np_arr.tolist()
    gathered = bytearray(2 * comm.size)
    comm.allgather(gathered, bytes([r, r]))
    out["bytes in"] = list(gathered)
    return out


def test_host_objects_end_to_end():
    for _rank, out in enumerate(run_ranks(_host_kinds, 2)):
        assert out["bytearray"] == [2] * 8
        assert out["memoryview"] == 3
        assert out["array.array"] == [2.0] * 3
        assert out["dlpack"] == [2.0] * 5
        assert out["bytes in"] == [0, 0, 1, 1]


def _device_refused(comm):
    messages = []
    for obj in (DeviceArray((4,)), DeviceArray((2, 2), "<i8")):
        try:
            comm.allreduce(obj)
        except InvalidArgument as e:
            messages.append(str(e))
    a = np.ones(3)
    comm.allreduce(a)            # the communicator is intact: nothing was sent
    return messages, a.tolist()


def test_device_objects_are_refused_before_any_byte_moves_without_cuda():
    # no visible device even where CuPy and a GPU are; spawned, so that no rank inherits
    # this process's answer to "is there a device?"
    for messages, after in run_ranks(_device_refused, 2, env={"CUDA_VISIBLE_DEVICES": ""},
                                     start_method="spawn"):
        assert after == [2.0, 2.0, 2.0]
        assert len(messages) == 2
        for m in messages:
            assert "cuda:0 device memory" in m and "Nothing was sent" in m, m


def test_classification():
    b = as_buffer(DeviceArray((3, 4), "<f2", device=1))
    assert (b.mem_type, b.device, b.dtype, b.count, b.nbytes) == (CUDA, 1, "float16", 12, 24)
    with pytest.raises(InvalidArgument, match="not C-contiguous"):
        as_buffer(DeviceArray((3, 4), "<f4", strides=(4, 12)))
    with pytest.raises(InvalidArgument, match="read-only"):
        as_buffer(b"abc")
    assert as_buffer(b"abc", writable=False).dtype == "uint8"
    assert as_buffer(memoryview(bytearray(8)).cast("f")).dtype == "float32"
    with pytest.raises(InvalidArgument, match="not C-contiguous"):
        as_buffer(memoryview(bytearray(8))[::2])
    with pytest.raises(InvalidArgument, match="buffer protocol"):
        as_buffer(object())
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidArgument, match="device meta"):
        as_buffer(torch.empty(4, device="meta"))
    assert as_buffer(torch.zeros(3, dtype=torch.bfloat16)).dtype == "bfloat16"


def test_memref_slices_share_memory():
    raw = bytearray(range(16))
    ref = MemRef.of(raw)
    part = ref.sub(4, 8)
    assert (part.nbytes, part.mem_type, part.ptr - ref.ptr) == (8, HOST, 4)
    assert bytes(part.host_view()) == bytes(range(4, 12))
    with pytest.raises(ValueError):
        ref.sub(10, 8)
    dev = MemRef.device_memory(0x1000, 64, device=0)
    assert dev.sub(16, 8).ptr == 0x1010 and dev.sub(16, 8).device == 0
    with pytest.raises(TypeError, match="no host view"):
        dev.host_view()
