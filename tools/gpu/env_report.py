"""Versions and settings of the GPU machine that a run's numbers depend on."""
from __future__ import annotations

import os
import platform
import sys


def main() -> None:
    print(sys.version.replace("\n", " "), platform.platform())
    import numba
    import numpy
    print("numpy", numpy.__version__, "numba", numba.__version__)
    try:
        import torch
        print("torch", torch.__version__, "cuda", torch.version.cuda,
              "available", torch.cuda.is_available(),
              "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)
        print("allocator backend", torch.cuda.get_allocator_backend())
    except Exception as e:          # report, go on
        print("torch:", type(e).__name__, e)
    print("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    try:
        import cupy
        print("cupy", cupy.__version__, "runtime", cupy.cuda.runtime.runtimeGetVersion(),
              "driver", cupy.cuda.runtime.driverGetVersion())
    except Exception as e:
        print("cupy:", type(e).__name__, e)
    import pycoll.cuda
    print("pycoll.cuda:", pycoll.cuda.unavailable_reason() or "usable")
    from pycoll.fastpath import compiled
    print("pycoll C call path:", getattr(compiled, "callpath", None) is not None,
          getattr(compiled, "unavailable", ""))


if __name__ == "__main__":
    main()
