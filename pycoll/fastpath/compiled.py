"""The fast call's Python, compiled or not: ``callpath`` (``fastpath/callpath.py``, with
``runtime/state.py``), and why it runs interpreted.

setup.py compiles both with Cython where Cython and a C compiler are found at install; the
same source runs interpreted otherwise, about a microsecond slower per small call
(docs/algorithms.md#the-compiled-call-path). ``PYCOLL_FASTPATH_C=0`` chooses the
interpreted form (``runtime.compiled``).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from ..runtime.compiled import load

if TYPE_CHECKING:
    from . import callpath
    _why = ""
else:
    callpath, _why = load("pycoll.fastpath.callpath")

#: why the call path runs interpreted ('' : it runs compiled)
unavailable: str = "" if callpath.COMPILED else (_why or load("pycoll.runtime.state")[1]
                                                 or "not built")

_warned: list[bool] = []


def warn_if_not_built() -> None:
    """One line, once per process, when the install did not compile the call path (pip
    shows setup.py's warning only with -v): small fast calls then take about a microsecond
    more each. Not when ``PYCOLL_FASTPATH_C=0`` chose the interpreted form. Rank 0 of a
    communicator that takes the fast path calls it (``FastPath``)."""
    if callpath.COMPILED or _warned or unavailable == "PYCOLL_FASTPATH_C=0":
        return
    _warned.append(True)
    # explicit, at line 0 of this file: the warning prints as one line (no source line)
    warnings.warn_explicit(f"pycoll: small fast calls run their Python path, about a "
                           f"microsecond slower each: the compiled call path is {unavailable} "
                           "(PYCOLL_FASTPATH_C=0 chooses the Python path and silences this)",
                           RuntimeWarning, __file__, 0, module=__name__)
