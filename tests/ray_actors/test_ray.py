"""Ray (``pycoll.ray``) with a real local Ray cluster: a GCS, a raylet and one worker process
per actor, each rank a process of its own talking shared memory to the others.

One cluster serves every test of the module (it declares 4 logical CPUs, so 4 ranks of one
CPU each fit on a 2-core machine); it is shut down at the end, and the module checks that no
process of it is left (every process of the cluster carries a tag in its environment).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'pycoll[ray]')")

from cluster_procs import TAG, tagged_processes, wait_gone  # noqa: E402

import pycoll  # noqa: E402
import pycoll.ray  # noqa: E402
from pycoll.ray import RayJobTimeout, RayRankFailed  # noqa: E402
from pycoll.testing.jobs import fails_on, store_stranger  # noqa: E402

# above the longest limits a test passes (start_timeout 120 s, the default, and job_timeout
# 120 s), so that a slow start on a crowded machine ends in pycoll's error, not pytest's
pytestmark = pytest.mark.timeout(300)

CPUS = 4


@pytest.fixture(scope="module")
def cluster():
    tag = uuid.uuid4().hex
    temp = tempfile.mkdtemp(prefix="pycoll-ray-")     # short: Ray's sockets live in it
    os.environ[TAG] = tag
    # this module's functions travel by value: the actors cannot import a test module
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        ray.init(num_cpus=CPUS, include_dashboard=False, object_store_memory=80 << 20,
                 _temp_dir=temp, log_to_driver=False, configure_logging=False)
        yield ray
    finally:
        ray.shutdown()
        os.environ.pop(TAG, None)
        left = wait_gone(tagged_processes(tag), 30)
        shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"processes of the Ray cluster outlived ray.shutdown(): {left}"


def job(comm, n):
    import os

    import numpy as np
    import ray

    import pycoll

    x = np.arange(n, dtype=np.float64) * (comm.rank + 1)
    pycoll.allreduce(x)                                  # the default communicator
    mine = np.full(3, comm.rank, dtype=np.int64)
    every = np.empty(3 * comm.size, dtype=np.int64)
    comm.allgather(every, mine)
    return {"rank": comm.rank, "size": comm.size, "x": x, "every": every, "pid": os.getpid(),
            "node": ray.util.get_node_ip_address()}


@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_and_allgather(cluster, world):
    results = pycoll.ray.run(job, world, args=(1000,), timeout=60, start_timeout=60,
                             job_timeout=120)
    assert [r["rank"] for r in results] == list(range(world))
    expected = np.arange(1000, dtype=np.float64) * sum(range(1, world + 1))
    for r in results:
        assert r["size"] == world
        np.testing.assert_array_equal(r["x"], expected)        # exact: small integers
        np.testing.assert_array_equal(r["every"], np.repeat(np.arange(world), 3))
    pids = [r["pid"] for r in results]
    assert len(set(pids)) == world and os.getpid() not in pids    # one process per rank
    assert not wait_gone(pids, 30), "the actors outlived run()"


def test_kwargs_and_fractional_cpus(cluster):
    """Four ranks of a quarter CPU each fit in one CPU's worth of the cluster."""
    def scaled(comm, *, factor):
        import numpy as np

        x = np.full(4, float(comm.rank))
        comm.allreduce(x)
        return x * factor

    out = pycoll.ray.run(scaled, 4, kwargs={"factor": 2.0}, num_cpus=0.25, timeout=60,
                         job_timeout=120)
    for x in out:
        np.testing.assert_array_equal(x, np.full(4, 12.0))


def test_a_raising_rank_is_named(cluster):
    with pytest.raises(RayRankFailed) as info:
        pycoll.ray.run(fails_on, 4, args=(1,), timeout=60, job_timeout=120)
    err = info.value
    assert err.rank == 1, str(err)
    assert "rank 1 of 4" in str(err)
    assert "ValueError: rank 1's data is bad" in str(err), str(err)
    assert err.node and f"node {err.node}" in str(err), str(err)
    assert isinstance(err, pycoll.PycollError)


def test_a_killed_actor_is_named(cluster):
    """Rank 2's process is SIGKILLed mid-job: no exception, no abort record. Ray reports the
    actor dead, its peers report it lost; either way the driver names rank 2, and at once: the
    others' collectives do not wait out their timeout (300 s, longer than job_timeout: a
    failure that waited would be a RayJobTimeout)."""
    def crash(comm):
        import os
        import signal

        import numpy as np

        x = np.ones(8)
        comm.allreduce(x)                 # every rank is up and connected
        if comm.rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.allreduce(x)
        return x

    with pytest.raises(RayRankFailed) as info:
        pycoll.ray.run(crash, 4, timeout=300, job_timeout=120)
    assert info.value.rank == 2, str(info.value)
    assert "rank 2 of 4" in str(info.value) and "was lost" in str(info.value), str(info.value)


def test_a_result_that_does_not_serialize_names_its_rank(cluster):
    def job(comm):
        import threading

        return threading.Lock() if comm.rank == 1 else comm.rank

    with pytest.raises(RayRankFailed, match="does its result serialize") as info:
        pycoll.ray.run(job, 2, timeout=60, job_timeout=120)
    assert info.value.rank == 1, str(info.value)


def test_job_timeout_kills_the_job(cluster, tmp_path):
    """Rank 0 sleeps past the test's own timeout, rank 1 returns: the job is killed at
    job_timeout, and the error names rank 0 alone. job_timeout counts from when the ranks
    were handed fn, so it also covers their bootstrap: it leaves a loaded host ample time
    for rank 1 to finish."""
    def sleepy(comm, folder):
        import os
        import time

        with open(os.path.join(folder, f"pid{comm.rank}"), "w") as f:
            f.write(str(os.getpid()))
        if comm.rank == 0:
            time.sleep(600)
        return comm.rank

    with pytest.raises(RayJobTimeout, match=r"job_timeout=30 s \(ranks \[0\] still running\)"):
        pycoll.ray.run(sleepy, 2, args=(str(tmp_path),), timeout=60, job_timeout=30)
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    assert not wait_gone(pids, 30), "the sleeping actor outlived run()"


def test_a_group_that_cannot_be_placed(cluster):
    """Two ranks of 3 CPUs on a 4-CPU cluster: the placement group never fits. run() says
    so within start_timeout, and removes the group (the next test's group still fits)."""
    with pytest.raises(RayJobTimeout, match="was not placed within start_timeout=3 s"):
        pycoll.ray.run(job, 2, args=(4,), num_cpus=3, start_timeout=3)
    out = pycoll.ray.run(job, 2, args=(4,), timeout=60, start_timeout=60, job_timeout=120)
    assert [r["rank"] for r in out] == [0, 1]


def test_the_store_refuses_strangers(cluster):
    """Rank 1 plays a stranger before joining in: it reaches rank 0's store (the address the
    bootstrap handed it over Ray) without the secret and with a wrong one, is refused both
    times, and then the job runs."""
    out = pycoll.ray.run(store_stranger, 2, timeout=60, job_timeout=120)
    assert [x for x, _ in out] == [3.0, 3.0]
    assert len(out[1][1]) == 2 and "let in" not in out[1][1], out[1]


def test_ctrl_c_on_the_driver_kills_the_job(cluster, tmp_path):
    """A KeyboardInterrupt while run() waits (SIGINT from a thread, once every rank is in fn)
    propagates, and the actors and the placement group are gone all the same."""
    def stuck(comm, folder):
        import os
        import time

        with open(os.path.join(folder, f"pid{comm.rank}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(120)

    sent: list = []

    def interrupt() -> None:
        deadline = time.monotonic() + 150        # past start_timeout: the actors started
        while time.monotonic() < deadline and len(list(tmp_path.glob("pid*"))) < 2:
            time.sleep(0.1)
        # where run() was when the signal went: what a failure needs to say
        main = sys._current_frames().get(threading.main_thread().ident)
        stack = [f.f_code.co_name for f, _ in traceback.walk_stack(main)][:6] if main else []
        sent.append(f"{len(list(tmp_path.glob('pid*')))} pid files, main thread in {stack}, "
                    f"SIGINT handler {signal.getsignal(signal.SIGINT)!r}")
        os.kill(os.getpid(), signal.SIGINT)

    before = set(ray.util.placement_group_table())
    # Python's own Ctrl-C handler, as an interactive driver has it: a pytest started in the
    # background by a non-interactive shell inherits SIGINT ignored (and Python then installs
    # no handler), which is not what this test is about
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            try:
                pycoll.ray.run(stuck, 2, args=(str(tmp_path),), timeout=60, job_timeout=120)
            except RayJobTimeout as e:
                raise AssertionError(f"the SIGINT ({sent}) did not interrupt run(): {e}") from e
    finally:
        signal.signal(signal.SIGINT, previous)
    thread.join(10)
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    assert not wait_gone(pids, 30), "the actors outlived the interrupted run()"
    groups = ray.util.placement_group_table()
    ours = [g for pg_id, g in groups.items() if pg_id not in before
            and str(g.get("name", "")).startswith("pycoll-")]
    assert ours and all(g["state"] == "REMOVED" for g in ours), ours


@pytest.mark.parametrize("call, match", [
    (lambda: pycoll.ray.run(job, 0), "num_ranks must be a positive int"),
    (lambda: pycoll.ray.run(job, True), "num_ranks must be a positive int"),
    (lambda: pycoll.ray.run("job", 2), "fn must be callable"),
    (lambda: pycoll.ray.run(job, 2, strategy="ANYWHERE"), "strategy must be one of"),
    (lambda: pycoll.ray.run(job, 2, num_cpus=-1), "CPU per rank must be a number >= 0"),
    (lambda: pycoll.ray.run(job, 2, num_cpus=0), "Ray refuses an empty placement-group"),
    (lambda: pycoll.ray.run(job, 2, args=5), "args must be a sequence"),
    (lambda: pycoll.ray.run(job, 2, timeout=0), "timeout must be > 0"),
], ids=["zero", "bool", "fn", "strategy", "negative-cpus", "no-resources", "args", "timeout"])
def test_bad_arguments_are_refused_before_ray_starts_anything(call, match):
    """No cluster fixture: these raise before Ray is even connected."""
    with pytest.raises(pycoll.InvalidArgument, match=match):
        call()


# -- rank 0's mailbox (the bootstrap's meeting point), with real threads --------------------------
def test_the_mailbox_names_the_ranks_that_never_arrived():
    from pycoll.ray.actor import Mailbox

    box = Mailbox(3)
    seen: dict[int, object] = {}

    def arrive(rank: int) -> None:
        try:
            seen[rank] = box.gather(0, rank, f"from {rank}", 0.5)
        except pycoll.PycollError as e:
            seen[rank] = e

    threads = [threading.Thread(target=arrive, args=(r,)) for r in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for rank in (0, 2):
        assert isinstance(seen[rank], pycoll.PycollError), seen
        assert "ranks [1] did not reach round 0" in str(seen[rank])


def test_the_mailbox_hands_every_rank_every_message():
    from pycoll.ray.actor import Mailbox

    box = Mailbox(4)
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, box.gather(7, r, r * 10,
                                                                                  10.0)))
               for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == {r: [0, 10, 20, 30] for r in range(4)}


def test_a_killed_rank_0_is_named(cluster):
    """Rank 0 holds the job's store and is the bootstrap's meeting point: killed, it is
    still the rank named, not one of the ranks that lost it."""
    def crash0(comm):
        import os
        import signal

        import numpy as np

        if comm.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        x = np.ones(2)
        comm.allreduce(x)
        return x

    with pytest.raises(RayRankFailed) as info:
        pycoll.ray.run(crash0, 3, timeout=60, job_timeout=120)
    assert info.value.rank == 0, str(info.value)
