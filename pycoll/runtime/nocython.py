"""``cython`` for the modules written in Cython's pure-Python mode (``runtime/state.py``,
``fastpath/callpath.py``) where Cython is not installed: they run interpreted, and read only
``compiled`` (their compiled-only branches never run then)."""
compiled = False
