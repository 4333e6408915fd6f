"""Module paths of the flat layout before the layers still import (pycoll/_moved.py)."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from pycoll._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_new_module(old):
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def test_old_import_statements_work_in_a_fresh_interpreter():
    code = ("import pycoll.tuning, pycoll.memory\n"
            "from pycoll.communicator import Communicator\n"
            "from pycoll.transports.tcp import TcpTransport\n"
            "from pycoll.transports.shm import ShmChannel\n"
            "from pycoll.flight_recorder import dump\n"
            "import pycoll.algorithms.selection as s, pycoll.comm.communicator as c\n"
            "assert pycoll.tuning is s and Communicator is c.Communicator\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_package_that_replaced_a_module_still_refuses_unknown_names():
    with pytest.raises(ImportError):
        exec("from pycoll.transports.tcp import NoSuchName", {})
