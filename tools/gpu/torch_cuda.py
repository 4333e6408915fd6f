"""The torch backend on CUDA tensors: tests/torch_backend's "cuda" scenario (pycoll's ops
checked against Gloo's on the same tensors) on 2 ranks, one line per rank."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "torch_backend"))

from torch_harness import run_scenario  # noqa: E402


def main() -> int:
    results = run_scenario("cuda", 2, timeout=80)
    for rank, res in enumerate(results):
        keys = ("status", "exit", "checked", "failures", "error")
        print(f"rank {rank}:", json.dumps({k: res.get(k) for k in keys})[:3000], flush=True)
        if res.get("status") != "ok":
            print(str(res.get("traceback", ""))[-2500:], str(res.get("output", ""))[-1500:])
    return 0 if all(res.get("status") == "ok" for res in results) else 1


if __name__ == "__main__":
    sys.exit(main())
