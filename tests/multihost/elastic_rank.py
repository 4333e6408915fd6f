"""One rank of an elastic trial across namespace hosts (``elastic_jobs.py``).

``python elastic_rank.py OUT`` (rank, world and the store from the environment: torchrun-style
variables with ``PYCOLL_STORE_EXTERNAL=1``, the store a process of its own that outlives every
rank). The rank runs the loop of mixed, checked collectives of ``pycoll.testing.kill_trials``
(``mixed_step``); after its first ``WARMUP`` steps it writes ``OUT/ready<rank>`` (pid, host).
When a call fails (a peer was killed, a cable pulled) it recovers as every survivor does
(``recover``: shrink, checked steps and a closing agree on the shrunk communicator) and writes
``OUT/elastic<rank>.json``:

* ``outcome``: "recovered" (ended on a shrunk communicator whose steps and agree went
  through), "excluded" (the others went on without this rank: ``Excluded``), "wrong" (a
  collective returned a wrong result: never acceptable), "failed" (any other exception,
  named in ``error``), "no-fault" (the loop ran ``ELASTIC_LOOP_SECONDS`` without an error);
* ``t_error``: ``time.monotonic()`` when the first call failed (one clock for every namespace
  host of the machine), ``t_first_ok``: when the first collective on the shrunk communicator
  returned (None: never);
* ``final_size``, ``final_rank``, ``final_ok``, ``recoveries``, the first error's type and
  message, and the errors met while recovering.

The rank then exits 0 (the trial's driver judges the JSON) or, on "wrong", 1.
``ELASTIC_TIMEOUT``: the collective and shrink deadline (default 30 s).
"""
import faulthandler
import os
import signal
import socket
import sys
import time
import traceback

import pycoll
from pycoll.testing.hosts import write_json
from pycoll.testing.kill_trials import Plan, WrongResult, mixed_step, recover

#: checked steps before the rank says it is ready (every message size of the loop once)
WARMUP = 3

out = sys.argv[1]
faulthandler.register(signal.SIGUSR1, all_threads=True)   # a hung rank's stacks, on request
comm = pycoll.init(timeout=float(os.environ.get("ELASTIC_TIMEOUT", "30")))
me = comm.rank
result: dict = {"rank": me, "host": socket.gethostname(), "pid": os.getpid(),
                "outcome": "no-fault", "t_error": None, "t_first_ok": None,
                "final_size": comm.size, "final_rank": me, "final_ok": False,
                "recoveries": 0, "recover_errors": "", "error": "", "message": ""}


def note(e: BaseException) -> None:
    """The first error is the fault's detection; a later one ended the recovery."""
    if not result["error"]:
        result.update(error=type(e).__name__, message=str(e)[:3000])
    else:
        result["last_error"] = f"{type(e).__name__}: {str(e)[:2000]}"


step = 0
stop = time.monotonic() + float(os.environ.get("ELASTIC_LOOP_SECONDS", "120"))
try:
    while time.monotonic() < stop:
        try:
            mixed_step(comm, step)
        except WrongResult:
            raise
        except pycoll.PycollError as e:
            result["t_error"] = time.monotonic()
            note(e)
            comm, report = recover(comm, Plan(victim=-1, delay=0.0), me, need_shrink=True,
                                   grown=True)
            result.update(t_first_ok=report["first_ok"], final_ok=report["final_ok"],
                          recoveries=report["recoveries"], recover_errors=report["error"],
                          final_size=comm.size, final_rank=comm.rank,
                          outcome="recovered" if report["final_ok"] else "failed")
            break
        step += 1
        if step == WARMUP:
            write_json(out, f"ready{me}", {"pid": os.getpid(), "host": socket.gethostname()})
except WrongResult as e:
    note(e)
    result.update(outcome="wrong", traceback=traceback.format_exc()[-3000:])
except pycoll.Excluded as e:
    result.update(outcome="excluded", excluded=str(e)[:1000])
    note(e)
except Exception as e:  # noqa: BLE001 - whatever it is, the driver must see it
    note(e)
    result.update(outcome="failed", traceback=traceback.format_exc()[-3000:])
result.update(steps=step, t_end=time.monotonic())
write_json(out, f"elastic{me}.json", result)
sys.exit(1 if result["outcome"] == "wrong" else 0)
