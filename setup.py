"""Build of the optional C part (everything else is in pyproject.toml).

``pycoll.fastpath._callpath`` is the small fast calls' Python path in C, and
``pycoll.runtime._execution_state`` the execution's per-call fields it reads (see their
sources). Both are optional: without a C compiler (or Python's headers) the build says so
and goes on, and pycoll runs that path in Python, about a microsecond slower per small call
(docs/algorithms.md#the-compiled-call-path). Both include ``pycoll/object_fields.h`` (listed
in ``depends``, which also puts it in the sdist).
"""
from setuptools import Extension, setup

setup(ext_modules=[
    Extension(name, [source], depends=["pycoll/object_fields.h"], extra_compile_args=["-O2"],
              optional=True)
    for name, source in (("pycoll.runtime._execution_state", "pycoll/runtime/_execution_state.c"),
                         ("pycoll.fastpath._callpath", "pycoll/fastpath/_callpath.c"))])
