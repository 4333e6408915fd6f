"""What this host offers: optional packages, the fast path, and each transport's probe.

Nothing here initialises CUDA unless asked (``--cuda``: is a device visible?): the probe
of a transport that declares device memory asks only whether its runtime is installed, and
its details name the device runtime: CuPy, or pycoll's CPU simulator
(``PYCOLL_CUDA_SIMULATOR``), never a GPU.
The transports are judged by their own ``probe`` (``transports.registry.probe_all``), the
very check a rank makes at ``init``, so the report cannot disagree with a job.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from typing import Any

from ..buffers.memory import HOST
from ..errors import InvalidArgument
from ..transports import registry

#: import name -> distribution name (for the version), in the order they are reported
EXTRAS = {"numba": "numba", "torch": "torch", "cupy": "cupy", "pyverbs": "pyverbs",
          "mpi4py": "mpi4py"}
#: imported to say whether they work (cheap, and no device is touched)
IMPORT_CHECKED = ("numba", "mpi4py")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cupy_version() -> str | None:
    for dist in ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"):
        found = _version(dist)
        if found:
            return found
    return None


def extra(name: str) -> dict[str, Any]:
    """Whether the package is found, its version, and for some whether it imports."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    out: dict[str, Any] = {"found": found,
                           "version": _cupy_version() if name == "cupy" else _version(name)}
    if found and name in IMPORT_CHECKED:
        try:
            importlib.import_module(name)
            out["imports"] = True
        except Exception as e:  # noqa: BLE001 - a broken install raises anything
            out["imports"], out["error"] = False, f"{type(e).__name__}: {e}"
    return out


def extras() -> dict[str, dict[str, Any]]:
    return {name: extra(name) for name in EXTRAS}


def fast_path() -> dict[str, Any]:
    """The compiled one-host path: its limit here (``fastpath.probe_limit``, what a rank
    publishes) and, when off, why (``fastpath.unavailable_reason``); whether its small calls
    run their Python part compiled (``fastpath.compiled``: "c") or not ("python", and why)."""
    from ..fastpath import probe_limit, unavailable_reason
    from ..fastpath.compiled import callpath, unavailable
    calls = {"call_path": "c" if callpath.COMPILED else "python",
             "call_path_reason": unavailable}
    try:
        limit = probe_limit()
    except InvalidArgument as e:
        return {"on": False, "limit_bytes": 0, "reason": str(e), **calls}
    if limit:
        return {"on": True, "limit_bytes": limit, "reason": "", **calls}
    return {"on": False, "limit_bytes": 0,
            "reason": unavailable_reason() or "PYCOLL_FASTPATH_BYTES=0", **calls}


def transports(probe_cuda: bool) -> dict[str, Any]:
    """Every registered transport: allowed by ``PYCOLL_TRANSPORTS``, usable here, why not,
    and its probe record (the verbs device, for one), and its ``details``."""
    try:
        allowed: list[str] = registry.allowed_transports()
        allow_error = ""
    except InvalidArgument as e:
        allowed, allow_error = [], str(e)
    out: dict[str, Any] = {"allowed": allowed, "error": allow_error, "each": {}}
    for name in registry.REGISTRY:
        caps = registry.capabilities(name)
        entry: dict[str, Any] = {"allowed": name in allowed,
                                 "explicit_only": caps is not None and caps.in_process}
        records, missing = registry.probe_all([name])
        entry.update(usable=name in records, reason=missing.get(name, ""),
                     record=records.get(name))
        details = registry.transport_class(name).details() if caps is not None else None
        if caps is not None and not caps.memory_types <= {HOST}:
            details = dict(details or {})
            if probe_cuda:       # initialises CUDA
                from ..cuda import runtime
                details["device"] = runtime.unavailable_reason() or "visible"
            else:
                details["device"] = "not asked (pass --cuda; it initialises CUDA)"
        if details is not None:
            entry["details"] = details
        out["each"][name] = entry
    return out
