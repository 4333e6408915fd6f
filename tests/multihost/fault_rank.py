"""One rank of a multi-host fault test: allreduce in a loop until a fault ends it.

``python fault_rank.py OUT`` (rank, world and store from the environment, as rank_job.py).
After its first collectives (8 B and 1 MiB) the rank writes ``OUT/ready<rank>`` (its pid and
host); then it alternates 8-byte and 1 MiB allreduces until a pycoll error, and writes
``OUT/fault<rank>.json``: the exception's type and its classes, message, the ranks it names
(``named``: ``peer`` of a PeerLost, ``lost_rank`` of an Aborted, the awaited ranks of a
CollectiveTimeout), every rank the message's first line mentions, and ``time.monotonic()``
when it was caught (one clock for every namespace host of the machine). It then exits 1 with
the traceback, as a program that does not catch the error would (``pycoll.run`` sees it).

``FAULT_JOB_TIMEOUT``: the collective deadline (default 60 s, far above any detection bound);
``FAULT_JOB_SECONDS``: how long to loop without a fault before giving up (default 120 s).
"""
import os
import re
import socket
import sys
import time

import numpy as np

import pycoll
from pycoll.testing.hosts import write_json

out = sys.argv[1]
comm = pycoll.init(timeout=float(os.environ.get("FAULT_JOB_TIMEOUT", "60")))
r = comm.rank


def named_ranks(e: BaseException) -> list:
    """The ranks an error blames: who died, or whom the rank waited for."""
    for attr in ("peer", "lost_rank"):
        value = getattr(e, attr, None)
        if isinstance(value, int):
            return [value]
    text = str(e).split("\n")[0]
    for pattern in (r"whole job is waiting for rank\(s\) \[([\d, ]*)\]",
                    r"waiting for peer rank\(s\) \[([\d, ]*)\]"):
        m = re.search(pattern, text)
        if m:
            return [int(x) for x in m.group(1).split(",") if x.strip()]
    return []


small = np.ones(8 // 4, np.float32)
big = np.ones((1 << 20) // 4, np.float32)
comm.allreduce(small, "max")
comm.allreduce(big, "max")
write_json(out, f"ready{r}", {"pid": os.getpid(), "host": socket.gethostname()})
stop = time.monotonic() + float(os.environ.get("FAULT_JOB_SECONDS", "120"))
calls = 0
error = None
try:
    while time.monotonic() < stop:
        comm.allreduce(big if calls % 2 else small, "max")
        calls += 1
    result = {"kind": "none", "kinds": [], "message": "no error", "named": [], "mentioned": [],
              "t": time.monotonic()}
except pycoll.PycollError as e:
    t = time.monotonic()
    error = e
    result = {"kind": type(e).__name__, "kinds": [c.__name__ for c in type(e).__mro__],
              "message": str(e)[:3000], "named": named_ranks(e),
              "mentioned": sorted({int(x) for x in re.findall(r"\brank (\d+)",
                                                              str(e).split("\n")[0])}),
              "t": t}
result.update(rank=r, host=socket.gethostname(), pid=os.getpid(), calls=calls)
write_json(out, f"fault{r}.json", result)
if error is not None:
    raise error
