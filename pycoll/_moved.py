"""Module paths of earlier releases, kept importable after the layers got their folders.

``import pycoll.memory`` or ``from pycoll.tuning import Selector`` (the flat layout before
docs/architecture.md's layers) still work: a finder maps each old name to the module that now
holds the code, and both names are the same module object. Nothing here is imported unless
an old name is asked for. New code uses the new paths.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: old module path -> the module that holds its code now
MOVED = {
    "pycoll.abort": "pycoll.runtime.abort",
    "pycoll.bootstrap": "pycoll.comm.bootstrap",
    "pycoll.collectives": "pycoll.comm.collectives",
    "pycoll.communicator": "pycoll.comm.communicator",
    "pycoll.execution": "pycoll.runtime.execution",
    "pycoll.faultinject": "pycoll.testing.faults",
    "pycoll.faults": "pycoll.runtime.failures",
    "pycoll.flight_recorder": "pycoll.runtime.flight_recorder",
    "pycoll.fused": "pycoll.comm.fused",
    "pycoll.link_probe": "pycoll.algorithms.link_probe",
    "pycoll.memops": "pycoll.buffers.memops",
    "pycoll.memory": "pycoll.buffers.memory",
    "pycoll.persistent": "pycoll.comm.persistent",
    "pycoll.planning": "pycoll.comm.planning",
    "pycoll.reduction": "pycoll.buffers.reduction",
    "pycoll.tensors": "pycoll.buffers.tensors",
    "pycoll.topology": "pycoll.comm.topology",
    "pycoll.tuning": "pycoll.algorithms.selection",
    "pycoll.work": "pycoll.runtime.work",
    "pycoll.transports.shm_segment": "pycoll.transports.shm.segment",
    "pycoll.transports.tcp_setup": "pycoll.transports.wireup",
    "pycoll.transports.name_rules": "pycoll.transports.netif",
    "pycoll.transports.verbs_device": "pycoll.transports.verbs.device",
    "pycoll.torch.store": "pycoll.launch.torch_store",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass                                # already executed under its own name


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths in ``MOVED`` (and nothing else)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A package's ``__getattr__`` (PEP 562) serving ``names`` (name -> the submodule that
    defines it) on first use: a package that replaced a module keeps that module's names
    importable from its path without importing every submodule with the package."""
    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)
    return __getattr__


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())     # before the editable-install finder
