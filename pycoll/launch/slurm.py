"""What Slurm's environment says beyond ranks: the hosts of a step, and whether srun ran.

* ``expand_hostlist("node[01-04,07],gpu5")`` -> ``["node01", ..., "node04", "node07",
  "gpu5"]``: Slurm's compressed host lists (zero padding kept; several bracket groups in one
  name expand as a product, ``rack[1-2]-n[1-2]``).
* The store of a job on several nodes: the first host of the step's node list
  (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST`` / ``SLURM_NODELIST``), on port
  ``15000 + job id % 10000`` (Lightning's rule: jobs sharing a node get different ports)
  unless MASTER_ADDR / MASTER_PORT say otherwise.
* ``srun --mpi=pmi2`` also sets MPICH's ``PMI_RANK``/``PMI_SIZE``: when they agree with
  ``SLURM_PROCID``/``SLURM_NTASKS`` this is Slurm (its host list knows where rank 0 is).
* A batch script run without ``srun`` sees its allocation's ``SLURM_NTASKS`` but is one
  process: without a step (``SLURM_STEP_ID`` unset or the batch step) it would wait for ranks
  that never start, so it is an error at once.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

#: Slurm's step id of the batch script itself (and of the "extern" step): no srun there
_NOT_SRUN_STEPS = {"4294967294", "4294967295", "batch", "extern"}


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list; raise ValueError on malformed input."""
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        if item:
            hosts.extend(_expand_one(item))
    return hosts


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    parts.append("".join(cur))
    return parts


def _expand_one(item: str) -> list[str]:
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
    if m is None:
        return [item]
    head, ranges, tail = m.groups()
    values: list[str] = []
    for r in ranges.split(","):
        lo, sep, hi = r.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {r!r} in host list item {item!r}")
        if not sep:
            values.append(lo)
            continue
        width = len(lo)
        if int(hi) < int(lo) or int(hi) - int(lo) > 100000:
            raise ValueError(f"bad range {r!r} in host list item {item!r}")
        values.extend(str(v).zfill(width) for v in range(int(lo), int(hi) + 1))
    return [head + v + rest for v in values for rest in _expand_one(tail)]


def node_list(env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """(variable, hosts) of this step's nodes, or None if Slurm does not say."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        value = env.get(name)
        if value:
            return name, expand_hostlist(value)
    return None


def derived_port(env: Mapping[str, str]) -> int | None:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job and job.strip().isdigit():
        return 15000 + int(job) % 10000
    return None


def is_srun_of_pmi(env: Mapping[str, str]) -> bool:
    """``srun --mpi=pmi2``: PMI_* set by Slurm itself, agreeing with its own variables."""
    return ("SLURM_PROCID" in env and env.get("PMI_RANK") == env.get("SLURM_PROCID")
            and env.get("PMI_SIZE") in (env.get("SLURM_NTASKS"), env.get("SLURM_NPROCS")))


def outside_srun(env: Mapping[str, str]) -> bool:
    """Whether this is the batch script (or an ``salloc`` shell), not a task of ``srun``."""
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return step is None or step.strip() in _NOT_SRUN_STEPS
