"""``comm/mapped.py``: the copy a window makes itself into memory this process maps, in both
its forms (compiled by setup.py where it built, and the plain Python it is). Each case is
either taken (the copy done, as numpy would) or declined (nothing written: the transport's
path then checks and raises)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pycoll.comm import mapped as built


def _interpreted():
    """mapped.py loaded as source, whatever setup.py built beside it."""
    path = Path(built.__file__).with_name("mapped.py")
    # a name inside pycoll.comm, so that its relative import (``nocython`` where Cython is
    # not installed) resolves; not ``pycoll.comm.mapped``, which stays the built one
    spec = importlib.util.spec_from_file_location("pycoll.comm.mapped_source", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not module.COMPILED
    return module


FORMS = [pytest.param(_interpreted, id="interpreted"),
         pytest.param(lambda: built, id="compiled",
                      marks=pytest.mark.skipif(not built.COMPILED,
                                               reason="comm/mapped.py is not compiled here"))]


@pytest.fixture(params=FORMS)
def window(request):
    module = request.param()
    array = np.zeros(16, np.float32)
    flags = np.zeros(2, np.uint64)
    return module.MappedWindow(array, flags), array, flags


def test_taken_copies_match_numpy(window):
    w, array, _ = window
    src = np.arange(6, dtype=np.float32)
    assert w.put(src, 10) is True and array[10:].tolist() == src.tolist()
    assert w.put(np.ones((2, 3), np.float32), 0) is True and array[:6].tolist() == [1.0] * 6
    dst = np.zeros((2, 3), np.float32)
    assert w.get(dst, 10) is True and dst.ravel().tolist() == src.tolist()
    assert w.put(np.zeros(0, np.float32), 16) is True            # empty, at the end
    big = np.arange(1 << 15, dtype=np.float32)                   # a copy without the GIL
    wide = type(w)(np.zeros(1 << 15, np.float32), np.zeros(2, np.uint64))
    assert wide.put(big, 0) is True and wide.array.tolist() == big.tolist()


@pytest.mark.parametrize("case", [
    lambda w: w.put(np.ones(4, np.float64), 0),                   # another dtype
    lambda w: w.put(np.ones(8, np.float32)[::2], 0),              # strided
    lambda w: w.put([1.0, 2.0], 0),                               # not an array
    lambda w: w.put(np.ones(4, np.float32), 13),                  # runs past the end
    lambda w: w.put(np.ones(4, np.float32), -1),
    lambda w: w.put(np.ones(4, np.float32), True),                # a bool is no offset
    lambda w: w.put(np.ones(4, np.float32), 2.0),
    lambda w: w.put(np.ones(4, np.float32), 1 << 70),
    lambda w: w.get(np.zeros(4, np.float32)[::1].view(np.int32), 0),
    lambda w: w.get(np.frombuffer(bytes(16), np.float32), 0),     # read-only
    lambda w: w.get(np.zeros(8, np.float32)[::2], 0),             # strided
    lambda w: w.get(np.zeros(4, np.float32), 13),
], ids=["dtype", "strided", "list", "past-end", "negative", "bool", "float", "huge",
        "get-dtype", "get-readonly", "get-strided", "get-past-end"])
def test_declined_copies_write_nothing(window, case):
    w, array, _ = window
    array[:] = 7
    assert case(w) is False
    assert (array == 7).all()


def test_a_released_target_is_declined(window):
    w, array, flags = window
    flags[1] = 1                                   # the target set its closed word
    assert w.put(np.ones(4, np.float32), 0) is False and not array.any()
    assert w.get(np.zeros(4, np.float32), 0) is False
