"""Debug logging: ``PYCOLL_DEBUG=INFO`` logs setup and algorithm choices, ``DETAIL`` more.

Accepted values (any case): unset or empty and ``OFF`` (no pycoll handler: Python's default
of printing warnings and errors only), ``WARN``/``WARNING`` (warnings and errors, with the
rank prefix), ``INFO``, ``DETAIL`` (also every collective and the cross-rank fingerprint
checks) and ``DEBUG`` (DETAIL's log level without the fingerprint checks). Anything else
raises :class:`pycoll.InvalidArgument` naming the variable when a communicator is created.
"""
from __future__ import annotations

import logging
import sys

from .envvars import env_choice

logger = logging.getLogger("pycoll")

LEVELS = ("off", "warn", "warning", "info", "detail", "debug")
_LOG_LEVEL = {"WARN": logging.WARNING, "WARNING": logging.WARNING, "INFO": logging.INFO,
              "DETAIL": logging.DEBUG, "DEBUG": logging.DEBUG}


def level() -> str:
    """``PYCOLL_DEBUG`` upper-cased ('' when unset); InvalidArgument for an unknown value."""
    return env_choice("PYCOLL_DEBUG", "", LEVELS).upper()


def detail_enabled() -> bool:
    return level() == "DETAIL"


class RankHandler(logging.StreamHandler):
    """The stderr handler ``configure`` attaches (a later call replaces it, not the user's)."""


def configure(rank: int) -> None:
    """Attach a stderr handler with a rank prefix when PYCOLL_DEBUG asks for output."""
    log_level = _LOG_LEVEL.get(level())
    if log_level is None:
        return
    logger.setLevel(log_level)
    for h in list(logger.handlers):
        if isinstance(h, RankHandler):
            logger.removeHandler(h)
    handler = RankHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[pycoll rank {rank}] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
