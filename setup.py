"""Build of the optional compiled part (everything else is in pyproject.toml).

``pycoll/fastpath/callpath.py`` (the small fast call's Python: the methods' front, the call
around the kernel) and ``pycoll/runtime/state.py`` (the execution's and flight recorder's
per-call fields, and the steps that touch only them) are written in Cython's pure-Python
mode: their ``.pxd`` files type them, and Cython compiles them here (Cython and numpy, whose
own header the call reads arrays through, are build requirements). Optional: without Cython
or a C compiler (or Python's headers) the build warns and goes on, and the same modules run
as the plain Python they are, about a microsecond slower per small call
(docs/algorithms.md#the-compiled-call-path); ``pycoll-info`` says which form runs.
``PYCOLL_REQUIRE_C=1`` makes a failed build fail the install instead.

Without Cython: with pip's build isolation (the default) Cython is a build requirement that
pip fetches (pyproject.toml), so an offline install, or one where no Cython wheel fits, fails
as a whole before this file runs; ``pip install --no-build-isolation`` into an environment
without Cython gets the warning and the interpreted path (docs/install.md).
"""
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: the modules compiled, and the .pxd files that type them (in the same folders)
MODULES = ("pycoll.runtime.state", "pycoll.fastpath.callpath", "pycoll.comm.mapped")
#: only the .pxd is read: what the .py does not say, the module does not do differently
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "boundscheck": False,
              "wraparound": False, "warn.unreachable": False}


def _required() -> bool:
    return os.environ.get("PYCOLL_REQUIRE_C", "") not in ("", "0")


def _warn(name: str, why: object) -> None:
    bar = "*" * 78
    print(f"\n{bar}\nWARNING: pycoll's compiled module {name} did not build ({why}).\n"
          "pycoll works without it; small collectives run their Python path, about a\n"
          "microsecond slower each. Install a C compiler and Python's headers (gcc,\n"
          "python3-dev) and reinstall (Cython and numpy come as build requirements);\n"
          "PYCOLL_REQUIRE_C=1 makes this an error. See\n"
          f"docs/troubleshooting.md#the-compiled-call-path.\n{bar}\n", flush=True)


class BuildExt(build_ext):
    """build_ext whose optional extensions, when they fail, say so in a banner (pip shows a
    build's output only with -v, or when it fails: ``PYCOLL_REQUIRE_C=1``)."""

    def build_extension(self, ext: Extension) -> None:
        if _required():
            ext.optional = False
        try:
            super().build_extension(ext)
        except Exception as e:
            if not ext.optional:
                raise
            _warn(ext.name, e)


def _extensions() -> list[Extension]:
    """The modules as extensions from Cython's C, or none (and the banner) where Cython or
    numpy is missing: a build without isolation that lacks them."""
    try:
        import numpy
        from Cython.Build import cythonize
    except ImportError as e:
        if _required():
            raise
        for name in MODULES:
            _warn(name, e)
        return []
    extensions = [
        Extension(name, [name.replace(".", "/") + ".py"], include_dirs=[numpy.get_include()],
                  define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
                  extra_compile_args=["-O2"], optional=True)
        for name in MODULES]
    try:
        built = cythonize(extensions, compiler_directives=DIRECTIVES, quiet=True)
    except Exception as e:      # noqa: BLE001 - Cython's own failure: the same banner
        if _required():
            raise
        for name in MODULES:
            _warn(name, e)
        return []
    for ext in built:           # (cythonize's copies do not keep it)
        ext.optional = True
    return built


setup(cmdclass={"build_ext": BuildExt}, ext_modules=_extensions())
