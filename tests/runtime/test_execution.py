"""The execution's contract, in one process: what the collectives and the fast path rely on."""
from __future__ import annotations

import threading

import pytest

from pycoll.algorithms.primitives import Peers
from pycoll.buffers.memops import HostOps
from pycoll.errors import PycollError
from pycoll.runtime.calls import CallInfo
from pycoll.runtime.execution import Execution
from pycoll.runtime.failures import Failures
from pycoll.runtime.flight_recorder import COMPLETED, FlightRecorder
from pycoll.tags import call_bits, call_word, collective_tag, tag_low_bits
from pycoll.transports.progress import ProgressEngine

pytestmark = pytest.mark.timeout(30)


def _execution(capacity: int = 16) -> Execution:
    recorder = FlightRecorder(capacity) if capacity else None
    failures = Failures(0, 1, "world", None, None, 5.0, lambda: "none", recorder)
    peers = Peers(0, 1, {}, 0.0, 0, HostOps(), ProgressEngine())
    return Execution(0, 1, "world", 5.0, 3, peers, failures)


INFO = CallInfo("allreduce", 8, "float32", 2, "sum", algorithm="fastpath")


def test_begin_inline_numbers_records_and_makes_the_tags_word():
    ex = _execution()
    bits = call_bits(tag_low_bits("allreduce", 3), INFO.signature())
    for seq in (1, 2):
        word = ex.begin_inline(INFO, bits)
        # the formula written out in begin_inline is the one in tags.py
        assert word == call_word(seq, bits) and ex.seq == seq
        assert -word - 1 == collective_tag(seq, tag_low_bits("allreduce", 3), INFO.signature())
        rec = ex.current
        same = FlightRecorder(1).open(seq, INFO, rec[4], COMPLETED)   # the recorder's layout
        assert rec == same
        assert [e["state"] for e in ex.recorder.snapshot(ex.running_inline())][-1] == "started"
        ex.finish_inline()
        assert ex.running_inline() is None
        assert ex.recorder.snapshot()[-1]["state"] == "completed"
        assert ex.recorder.snapshot()[-1]["algorithm"] == "fastpath"


def test_begin_inline_declines_when_it_must_not_run_now():
    ex = _execution(capacity=0)
    bits = 5
    lock = ex.executor.idle()
    lock.acquire()                      # another call runs (a worker, another thread)
    assert ex.begin_inline(INFO, bits) == 0 and ex.seq == 0
    lock.release()
    ex.failed = PycollError("earlier failure")
    assert ex.begin_inline(INFO, bits) == 0
    with pytest.raises(PycollError, match="refused: this communicator failed earlier"):
        ex.execute(INFO, lambda peers: None, None, False)
    ex.failed = None
    ex.close()
    assert ex.begin_inline(INFO, bits) == 0
    with pytest.raises(PycollError, match="after finalize"):
        ex.execute(INFO, lambda peers: None, None, False)


def test_execute_runs_in_issue_order_and_counts_point_to_point_apart():
    ex = _execution()
    seen: list[tuple[str, int]] = []
    gate = threading.Event()

    def body(name):
        def run(peers):
            if name == "first":
                gate.wait(5)
            seen.append((name, peers.tag))
        return run

    w1 = ex.execute(INFO, body("first"), None, True)
    w2 = ex.execute(CallInfo("send", 8, "float32"), body("send"), None, True)
    # a synchronous call while asynchronous ones are queued must wait its turn
    done = threading.Thread(target=ex.execute, args=(INFO, body("third"), None, False))
    done.start()
    gate.set()
    done.join(5)
    assert w1.wait(5) and w2.wait(5)
    assert [n for n, _ in seen] == ["first", "send", "third"]
    assert (w1.seq, w2.seq, ex.seq, ex.p2p_seq) == (1, 1, 2, 1)
    low = tag_low_bits("allreduce", 3)
    assert seen[0][1] == collective_tag(1, low, INFO.signature())
    assert seen[2][1] == collective_tag(2, low, INFO.signature())
    ex.close()


def test_a_failed_call_fails_the_execution_with_the_call_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCOLL_TRACE_DIR", str(tmp_path))
    ex = _execution()

    def body(peers):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        ex.execute(INFO, body, None, False)
    assert isinstance(ex.failed, RuntimeError)
    entry = ex.recorder.snapshot()[-1]
    assert entry["state"] == "failed" and entry["error"] == "RuntimeError: boom"
    assert entry["dtype"] == "float32" and entry["op"] == "sum"
    assert len(list(tmp_path.glob("pycoll-trace-world-rank0.json"))) == 1   # dumped
    ex.close()
