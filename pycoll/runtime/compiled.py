"""Which form of the modules written in Cython's pure-Python mode runs: compiled or source.

``runtime/state.py`` and ``fastpath/callpath.py`` are the small fast call's Python, and
``comm/mapped.py`` a window's copy into memory this process maps: one source each, which
setup.py compiles with Cython where it can (their ``.pxd`` files type it) and which
otherwise runs as the plain Python it is. ``load`` imports one of them: the
compiled form where it was built and loads, else the source, and says why not.

``PYCOLL_FASTPATH_C=0`` chooses the source for all (the interpreted call path, as without
a compiler). It is the one variable read at ``import pycoll``: it picks the classes that
``Execution``, ``FlightRecorder`` and ``FastPath`` derive from.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

from ..envvars import env_bool
from ..errors import InvalidArgument


def _compiled_call_off() -> str:
    """Why ``PYCOLL_FASTPATH_C`` turns the compiled call off ('' : it does not). Read once, at
    import. A bad value turns it off rather than break ``import pycoll``;
    ``fastpath.probe_record`` raises it when a communicator is made."""
    try:
        return "" if env_bool("PYCOLL_FASTPATH_C", True) else "PYCOLL_FASTPATH_C=0"
    except InvalidArgument as e:
        return str(e)


#: why the compiled call is off by ``PYCOLL_FASTPATH_C`` ('' : it is not)
COMPILED_CALL_OFF = _compiled_call_off()


def load(name: str) -> tuple[ModuleType, str]:
    """The module ``name`` (``pycoll.runtime.state``, ``pycoll.fastpath.callpath``,
    ``pycoll.comm.mapped``), and why
    it runs interpreted ('' : it runs compiled). A compiled form that does not load (built
    against another version of a module it reads, say) is passed over for the source."""
    if name in sys.modules:
        module = sys.modules[name]
        return module, _why_interpreted(module)
    if not COMPILED_CALL_OFF:
        try:
            module = importlib.import_module(name)
        except Exception as e:      # noqa: BLE001 - any failure of a build means the source
            reason = f"{name}'s compiled form does not load ({e}): reinstall pycoll"
        else:
            return module, _why_interpreted(module)
    else:
        reason = COMPILED_CALL_OFF
    return _source(name), reason


def _why_interpreted(module: ModuleType) -> str:
    if COMPILED_CALL_OFF:
        return COMPILED_CALL_OFF
    if getattr(module, "COMPILED", False):
        return ""
    return (f"not built ({module.__name__} runs from its source): reinstall pycoll where a C "
            "compiler and Python's headers are found (docs/troubleshooting.md"
            "#the-compiled-call-path)")


def _source(name: str) -> ModuleType:
    """``name`` from its .py file, even where a compiled form is next to it."""
    package, _, leaf = name.rpartition(".")
    directory = os.path.dirname(importlib.import_module(package).__file__ or "")
    spec = importlib.util.spec_from_file_location(name, os.path.join(directory, leaf + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
