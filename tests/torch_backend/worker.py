"""One rank of a tests/torch scenario: ``python worker.py SCENARIO`` (env:// variables set).

Scenarios compare the "pycoll" backend against Gloo in the same processes: the default group
is pycoll, a second group over the same ranks is Gloo, and every op runs on both with the
same inputs. Each rank writes ``{"status": "ok" | "error", ...}`` to
``$PYCOLL_TEST_OUT/rank<r>.json``; ``failures`` lists every mismatch found.

The scenarios live in modules by concern (``SCENARIOS``); this module only runs one of them
and writes the rank's result.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from rank_helpers import RANK

OUT = os.environ["PYCOLL_TEST_OUT"]

#: scenario name -> the module that holds its ``scenario_<name>()``
SCENARIOS = {
    "ops": "op_checks",                  # every op against Gloo
    "ddp": "ddp_checks",                 # DDP parity with Gloo
    "cuda": "ddp_checks",                # CUDA tensors, DDP on CUDA
    "peer_failure": "failure_checks",    # a peer dies mid-training
    "timeout": "failure_checks",         # collectives a peer never joins
    "gaps": "gaps",                      # the closed gaps to Gloo
    "profiler": "gaps",                  # profiler events like Gloo's
    "mesh": "mesh_checks",               # groups share channels; 2-D mesh FSDP2 + TP
    "own_channels": "mesh_checks",       # a pycoll group under a Gloo default group
    "shrink_group": "elastic_checks",    # dist.shrink_group after a rank's death
    "shrink_subgroup": "elastic_checks",  # dist.shrink_group of a group, excluding a live rank
    "uneven": "uneven_checks",           # torch's uneven variants on pycoll's v calls
}


def write(result: dict) -> None:
    path = os.path.join(OUT, f"rank{RANK}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, default=str)
    os.replace(path + ".tmp", path)


def main() -> None:
    scenario = sys.argv[1]
    try:
        module = importlib.import_module(SCENARIOS[scenario])
        result = getattr(module, f"scenario_{scenario}")()
        result["status"] = "ok"
    except BaseException as e:
        result = {"status": "error", "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc()[-4000:]}
    write(result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
