"""One rank looping on ``comm.agree`` until it raises (``elastic_jobs.cut_off_in_agree``).

``python agree_rank.py OUT`` (rank, world and the store from the environment, as
``elastic_rank.py``). After a first agreement it writes ``OUT/ready<rank>``; when an agree
raises it writes ``OUT/error<rank>.json`` (the exception's type with its module, whether it is
a ``pycoll.PycollError``, its message and ``time.monotonic()``) and exits 0: ``finalize``
runs at exit, as in any program.
"""
import os
import sys
import time

import pycoll
from pycoll.testing.hosts import write_json

out = sys.argv[1]
comm = pycoll.init(timeout=30)
comm.agree(1)
write_json(out, f"ready{comm.rank}", {"pid": os.getpid()})
try:
    while True:
        comm.agree(1)
except Exception as e:  # noqa: BLE001 - whatever it raises is the finding
    write_json(out, f"error{comm.rank}.json", {
        "type": f"{type(e).__module__}.{type(e).__name__}",
        "pycoll_error": isinstance(e, pycoll.PycollError), "message": str(e)[:1000],
        "t": time.monotonic()})
