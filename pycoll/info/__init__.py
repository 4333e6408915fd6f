"""``python -m pycoll.info`` (``pycoll-info``): what is installed and usable here, like
``ompi_info`` / ``ucc_info``.

Sections: pycoll's version; the optional packages (numba, torch, cupy, pyverbs, mpi4py)
and the fast path; each transport, usable or not and why (its own probe); every
``PYCOLL_*`` variable with its value and default (``variables.VARIABLES``); with
``--algorithms -n N`` the cost model's choice per collective and size (``choices``).
``--json`` prints the same as one JSON object. It opens no connection and never
initialises CUDA unless ``--cuda`` asks whether a device is visible.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .._version import __version__
from ..errors import InvalidArgument


def report(algorithms: bool = False, ranks: int = 2, nodes: int | None = None,
           per_node: int | None = None, probe_cuda: bool = False) -> dict[str, Any]:
    """Everything the command prints, as one JSON-ready dict."""
    from . import probes, variables
    found = probes.extras()
    out: dict[str, Any] = {
        "version": __version__,
        "python": sys.version.split()[0],
        "extras": found,
        "fast_path": probes.fast_path(),
        "transports": probes.transports(probe_cuda),
        "environment": variables.current(),
    }
    if algorithms:
        from . import choices
        try:
            out["algorithms"] = choices.table(ranks, nodes, per_node)
        except InvalidArgument as e:
            out["algorithms"] = {"error": str(e)}
    return out


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n} B"


def render(rep: dict[str, Any]) -> str:
    """The human form: one section per key of ``report``."""
    lines = [f"pycoll {rep['version']} (Python {rep['python']})", "", "Optional packages:"]
    for name, e in rep["extras"].items():
        state = f"{e['version'] or 'found'}" if e["found"] else "missing"
        if e.get("imports") is False:
            state += f", does not import: {e['error']}"
        lines.append(f"  {name:<10} {state}")
    fp = rep["fast_path"]
    lines.append("  fast path  " + (f"on (up to {_size(fp['limit_bytes'])})" if fp["on"]
                                    else f"off: {fp['reason']}"))
    lines.append("  call path  " + ("compiled (C)" if fp["call_path"] == "c"
                                    else f"Python: {fp['call_path_reason']}"))
    tr = rep["transports"]
    lines += ["", "Transports (allowed: " + (", ".join(tr["allowed"]) or tr["error"]) + "):"]
    for name, t in tr["each"].items():
        state = {True: "usable", False: "not usable", None: "unknown"}[t["usable"]]
        extra = f": {t['reason']}" if t["reason"] else ""
        if t.get("record"):
            extra += " " + json.dumps(t["record"])
        flag = "" if t["allowed"] else " (not allowed)"
        lines.append(f"  {name:<9} {state}{flag}{extra}")
        for key, value in (t.get("details") or {}).items():
            shown = _size(value) if isinstance(value, int) else value
            lines.append(f"            {key}: {shown}")
    lines += ["", "Environment (value / default):"]
    section = None
    for v in rep["environment"]:
        if v["section"] != section:
            section = v["section"]
            lines.append(f"  [{section}]")
        value = "-" if v["value"] is None else v["value"]
        lines.append(f"  {v['name']:<30} {value!s:<14} {v['default'] or '-':<10} "
                     f"{v['meaning']}")
    if "algorithms" in rep:
        lines += ["", *_render_algorithms(rep["algorithms"])]
    return "\n".join(lines) + "\n"


def _render_algorithms(alg: dict[str, Any]) -> list[str]:
    if "error" in alg:
        return [f"Algorithms: {alg['error']}"]
    t = alg["transports"]
    lines = [f"Algorithms for {alg['ranks']} ranks on {alg['nodes']} node(s) x "
             f"{alg['ranks_per_node']} (intra-node: {t['intra_node'] or '-'}, "
             f"inter-node: {t['inter_node'] or '-'}):"]
    lines += [f"  note: {note}" for note in alg["notes"]]
    width = max(len(a) for row in alg["choices"].values() for a in row) + 1
    lines.append("  " + f"{'bytes':>9} " + "".join(f"{c:<{width}}" for c in alg["choices"]))
    for i, size in enumerate(alg["sizes"]):
        lines.append("  " + f"{_size(size):>9} "
                     + "".join(f"{row[i]:<{width}}" for row in alg["choices"].values()))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pycoll.info",
                                 description=__doc__.split("\n")[0].strip("`"))
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--algorithms", action="store_true",
                    help="the cost model's choice per collective and message size")
    ap.add_argument("-n", type=int, default=2, help="ranks in the job (default 2)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--nodes", type=int, help="equal nodes the ranks are spread over")
    where.add_argument("--ranks-per-node", type=int, help="ranks on each node")
    ap.add_argument("--cuda", action="store_true",
                    help="also ask whether a CUDA device is visible (initialises CUDA)")
    args = ap.parse_args(argv)
    rep = report(args.algorithms, args.n, args.nodes, args.ranks_per_node, args.cuda)
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print(render(rep), end="")
    return 0


__all__ = ["main", "render", "report"]
