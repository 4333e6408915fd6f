"""Build of the optional C part (everything else is in pyproject.toml).

``pycoll.fastpath._callpath`` is the small fast calls' Python path in C, and
``pycoll.runtime._execution_state`` the execution's and flight recorder's per-call fields it
reads (see their sources). It reads numpy's arrays through numpy's own headers (numpy is a
build requirement). Both are optional: without a C compiler (or Python's headers) the build
warns and goes on, and pycoll runs that path in Python, about a microsecond slower per small
call (docs/algorithms.md#the-compiled-call-path); ``pycoll-info`` says which path runs.
``PYCOLL_REQUIRE_C=1`` makes a failed build fail the install instead.
"""
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HEADERS = ["pycoll/object_fields.h", "pycoll/runtime/_execution_state.h"]


class BuildExt(build_ext):
    """build_ext whose optional extensions, when they fail, say so in a banner (pip shows a
    build's output only with -v, or when it fails: ``PYCOLL_REQUIRE_C=1``)."""

    def build_extension(self, ext: Extension) -> None:
        if os.environ.get("PYCOLL_REQUIRE_C", "") not in ("", "0"):
            ext.optional = False
        try:
            super().build_extension(ext)
        except Exception as e:
            if not ext.optional:
                raise
            bar = "*" * 78
            print(f"\n{bar}\nWARNING: pycoll's C extension {ext.name} did not build ({e}).\n"
                  "pycoll works without it; small collectives run their Python path, about "
                  "a\nmicrosecond slower each. Install a C compiler and Python's headers "
                  "(gcc,\npython3-dev) and reinstall; PYCOLL_REQUIRE_C=1 makes this an error. "
                  f"See\ndocs/troubleshooting.md#the-compiled-call-path.\n{bar}\n", flush=True)


def _numpy_include() -> list[str]:
    try:
        import numpy
    except ImportError:     # a build without isolation and without numpy: _callpath fails
        return []
    return [numpy.get_include()]


setup(cmdclass={"build_ext": BuildExt}, ext_modules=[
    Extension(name, [source], depends=HEADERS, include_dirs=includes, extra_compile_args=["-O2"],
              optional=True)
    for name, source, includes in (
        ("pycoll.runtime._execution_state", "pycoll/runtime/_execution_state.c", []),
        ("pycoll.fastpath._callpath", "pycoll/fastpath/_callpath.c", _numpy_include()))])
