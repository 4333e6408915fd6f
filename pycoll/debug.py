"""Debug logging: ``PYCOLL_DEBUG=INFO`` logs setup and algorithm choices, ``DETAIL`` more."""
from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("pycoll")


def level() -> str:
    return os.environ.get("PYCOLL_DEBUG", "").upper()


def detail_enabled() -> bool:
    return level() == "DETAIL"


def configure(rank: int) -> None:
    """Attach a stderr handler with a rank prefix when PYCOLL_DEBUG asks for output."""
    lvl = level()
    if lvl not in ("INFO", "DETAIL", "DEBUG"):
        return
    logger.setLevel(logging.DEBUG if lvl in ("DETAIL", "DEBUG") else logging.INFO)
    for h in list(logger.handlers):
        if getattr(h, "_pycoll", False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[pycoll rank {rank}] %(levelname)s %(message)s"))
    handler._pycoll = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False
