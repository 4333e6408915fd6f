"""``python -m pycoll.fastpath``: compile the fast path's kernels ahead of the first job."""
from . import NATIVE_DTYPES, probe_limit, warm

if __name__ == "__main__":
    if not probe_limit():
        print("pycoll.fastpath: off here (numba missing, PYCOLL_FASTPATH=0, or an "
              "unsupported platform); nothing to compile")
    else:
        print(f"pycoll.fastpath: kernels for {', '.join(NATIVE_DTYPES)} ready in "
              f"{warm():.1f} s")
