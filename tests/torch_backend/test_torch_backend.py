"""The "pycoll" torch.distributed backend, on real rank processes, checked against Gloo.

Each test starts N fresh Python processes (tests/torch_backend/worker.py, env:// variables as
torchrun sets them) that use the pycoll backend and a Gloo group side by side in the same processes.
"""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

from torch_harness import ROOT, describe, run_scenario  # noqa: E402


def _ok(results: list[dict], ranks=None) -> None:
    for r in (ranks if ranks is not None else range(len(results))):
        res = results[r]
        assert res.get("status") == "ok" and res.get("exit") == 0, describe(results)
        assert not res.get("failures"), describe(results)


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_op_matches_gloo(world_size):
    """all_reduce (all ops incl. AVG/PREMUL_SUM, all dtypes), broadcast, reduce,
    all_gather(_into_tensor), reduce_scatter(_tensor), all_to_all(_single, even/uneven),
    gather, scatter, p2p, batch_isend_irecv, object collectives, new_group, barrier, coalesced
    and functional collectives, sync and async; then destroy_process_group releases
    everything."""
    results = run_scenario("ops", world_size, timeout=100)
    _ok(results)
    assert all(res["checked"] > 250 for res in results), describe(results)


def test_ddp_parity_with_gloo():
    """Identical parameters after DDP training on pycoll and on Gloo: default and small
    buckets, allreduce_hook, fp16_compress_hook, no_sync, find_unused_parameters, float64."""
    results = run_scenario("ddp", 2, timeout=100)
    _ok(results)
    assert all(res["checked"] >= 50 for res in results), describe(results)


def test_peer_death_mid_training_raises_from_backward():
    """The last rank dies in step 3; the survivor's loss.backward() raises RuntimeError
    (PeerLost), later collectives are refused at once, and teardown leaves nothing behind."""
    results = run_scenario("peer_failure", 2, timeout=60)
    survivor, dead = results
    assert dead["exit"] == 17, describe(results)
    assert survivor.get("status") == "ok" and survivor["exit"] == 0, describe(results)
    assert survivor.get("steps") == 3, describe(results)
    assert survivor.get("error_type") == "RuntimeError", describe(results)
    assert "PeerLost" in survivor["error"] and "peer rank 1" in survivor["error"], \
        describe(results)
    assert "refused" in survivor["after"], describe(results)
    assert survivor["future_after"] != "no error", describe(results)
    assert survivor["leftovers"] == {}, describe(results)


@pytest.mark.parametrize("flags", [0, 1], ids=["SHRINK_DEFAULT", "SHRINK_ABORT"])
def test_shrink_group_after_a_rank_dies(flags):
    """4 ranks; rank 3 is SIGKILLed in step 3; the survivors' backward raises, they call
    torch.distributed.shrink_group([3]) (the pycoll group reports supports_shrinking) and
    train on as 3 ranks with identical replicas, on the new default group."""
    results = run_scenario("shrink_group", 4, timeout=90, env={"SHRINK_FLAGS": str(flags)})
    assert results[3]["status"] == "missing", describe(results)
    for res in results[:3]:
        assert res.get("status") == "ok", describe(results)
        assert res["is_default"] and res["backend"] == "pycoll", describe(results)
        assert res["supports_shrinking"] is True, describe(results)
        assert res["failed_step"] == 3 and "PeerLost" in res["error"], describe(results)
        assert res["new_size"] == 3 and res["replicas_equal"], describe(results)
        assert res["sum"] == [3.0, 3.0, 3.0]
    assert sorted(res["new_rank"] for res in results[:3]) == [0, 1, 2]


def test_shrink_group_of_a_group():
    """4 ranks, a group of 0..2; ranks 0 and 1 shrink it without rank 2 (alive, not
    calling): their new group of 2 reduces right over the default group's channels (nothing
    failed: SHRINK_DEFAULT shares them), the old group refuses, and the default group of 4
    still works for everyone."""
    results = run_scenario("shrink_subgroup", 4, timeout=90)
    for res in results:
        assert res.get("status") == "ok", describe(results)
        assert res["world_sum"] == 4.0, describe(results)
    for r in (0, 1):
        res = results[r]
        assert res["size"] == 2 and res["ranks"] == [0, 1], describe(results)
        assert res["sum"] == [3.0] * 4 and not res["is_default"], describe(results)
        assert res["old_group"] != "no error", describe(results)
        assert res["shares_channels"], describe(results)


def test_timeouts_are_enforced():
    """init_process_group(timeout=3 s) bounds a collective a peer never joins (raised from
    get_future().wait() and wait()); barrier(timeout=1 s) on a group with the default 1800 s."""
    results = run_scenario("timeout", 2, timeout=60)
    _ok(results)
    r0 = results[0]
    assert r0["barrier"] == "CollectiveTimeout", describe(results)
    assert r0["future"] == "RuntimeError" and "timed out" in r0["future_msg"], describe(results)
    assert r0["wait"] != "no error", describe(results)
    assert r0["leftovers"] == {} and results[1]["leftovers"] == {}, describe(results)


def _gloo_teardown_abort(out: str) -> bool:
    """Gloo's run printed its result line and then died in C++ teardown, nothing else."""
    return ("step time median" in out and "terminate called without an active exception" in out
            and "signal 6 (SIGABRT)" in out and "Traceback" not in out)


def test_example_under_pycoll_run():
    """examples/ddp_train.py under the launcher; same checksum as Gloo's run."""
    sums = {}
    for backend in ("pycoll", "gloo"):
        proc = subprocess.run(
            [sys.executable, "-m", "pycoll.run", "-n", "2", "--timeout", "100",
             str(ROOT / "examples" / "ddp_train.py"), "--backend", backend, "--steps", "3",
             "--warmup", "1", "--width", "128", "--depth", "2"],
            cwd=str(ROOT), capture_output=True, text=True, timeout=110,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
        out = proc.stdout + proc.stderr
        if backend == "gloo" and proc.returncode != 0 and _gloo_teardown_abort(out):
            # The reference run printed its checksum and then Gloo aborted in its own
            # teardown (a C++ thread destroyed while joinable; once in 40 CI runs, never
            # reproduced here). The checksum it printed is still the reference; pycoll's
            # own run above had to exit 0.
            pass
        else:
            assert proc.returncode == 0, out
        line = [ln for ln in proc.stdout.splitlines() if "step time median" in ln]
        assert line and f"backend={backend}" in line[0], proc.stdout + proc.stderr
        sums[backend] = line[0].rsplit("checksum", 1)[1].strip()
    assert sums["pycoll"] == sums["gloo"], sums


def test_registration_and_single_rank_in_process():
    """Importing pycoll.torch registers the backend; a world of one works in-process."""
    import pycoll.torch as pt

    assert hasattr(dist.Backend, "PYCOLL")
    assert dist.Backend.backend_capability["pycoll"] == ["cpu", "cuda"]
    pt.register()   # idempotent
    store = dist.HashStore()
    dist.init_process_group("pycoll", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=10))
    try:
        pg = dist.group.WORLD
        assert isinstance(pg, pt.ProcessGroupPycoll) and pg.name() == "pycoll"
        assert dist.get_backend() == "pycoll"
        t = torch.arange(4.0)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert torch.equal(t, torch.arange(4.0))
        fut = dist.all_reduce(t, async_op=True).get_future()
        assert torch.equal(fut.wait()[0], torch.arange(4.0))
        with pytest.raises(RuntimeError):
            dist.all_reduce(torch.zeros(2), op=dist.ReduceOp.BAND)
    finally:
        dist.destroy_process_group()
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("pycoll-")]


def test_store_adapter_over_torch_store():
    """The adapter speaks pycoll's store protocol over a torch Store (HashStore here)."""
    from pycoll.errors import CollectiveTimeout
    from pycoll.launch.torch_store import TorchStoreAdapter

    s = TorchStoreAdapter(dist.PrefixStore("g/", dist.HashStore()), timeout=5)
    s.set("a", "1")
    s.set("b", b"2")
    assert s.multi_get(["a", "b"], timeout=1) == [b"1", b"2"]
    assert s.get("a") == b"1"
    assert s.add("n", 2) == 2 and s.add("n", 0) == 2
    assert s.check(["a"]) and not s.check(["zzz"])
    assert s.compare_set("t", "", "x") == b"x"
    with pytest.raises(CollectiveTimeout):
        s.multi_get(["a", "missing"], timeout=0.2)
    s.close()
    with pytest.raises(RuntimeError):
        s.set("a", "2")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device (or a CPU-only torch build): CUDA staging untested here")
def test_cuda_tensors_staged_through_host():
    results = run_scenario("cuda", 2, timeout=120)
    _ok(results)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_gaps_to_gloo_closed(world_size):
    """all_gather_coalesced in torch's [rank][i] layout, sparse COO all_reduce (duplicates,
    hybrid, sync/async, mismatch errors), recv without src (also under both profilers) and
    complex tensors: the same results as Gloo in the same run."""
    results = run_scenario("gaps", world_size, timeout=150)
    _ok(results)
    assert all(res["checked"] > 60 for res in results), describe(results)


@pytest.mark.parametrize("world_size", [2, 3])
def test_uneven_variants_map_onto_pycolls(world_size):
    """dist.reduce_scatter with input lists of different sizes (one empty) runs as pycoll's
    reduce_scatter_v (the exact sums and maxima), dist.all_gather into tensors of different
    sizes as allgatherv; sync and async."""
    results = run_scenario("uneven", world_size, timeout=90)
    _ok(results)
    assert all(res["checked"] >= 24 + 6 * world_size for res in results), describe(results)


@pytest.mark.parametrize("world_size", [2, 3])
def test_profiler_events_like_gloo(world_size):
    """torch.profiler and the autograd profiler show pycoll:<op> events with the same input
    shapes as Gloo's gloo:<op>, for synchronous and asynchronous calls."""
    results = run_scenario("profiler", world_size, timeout=120)
    _ok(results)


@pytest.mark.parametrize("transports", ["shm", "tcp"])
def test_groups_share_the_default_groups_channels(transports):
    """4 ranks: new_group, new_subgroups and init_device_mesh("cpu", (2, 2)) open no channel,
    socket or channel segment (counted per rank before and after; the one-host fast path adds
    one slot segment per group); their collectives and sequence numbers are right; FSDP2 on
    the dp dimension over tensor parallelism on tp trains to the same losses and parameters
    as on a Gloo mesh; destroying a subgroup leaves the default group working."""
    results = run_scenario("mesh", 4, timeout=240, env={"PYCOLL_TRANSPORTS": transports})
    _ok(results)
    for res in results:
        before, made = res["before"], res["after groups"]
        assert sum(before["channels"].values()) == 3, describe(results)
        for stage in ("after groups", "after training"):
            for what in ("channels", "sockets", "channel segments"):
                assert res[stage][what] == before[what], (stage, what, describe(results))
        # Gloo's mesh (sockets of its own) came since; pycoll's channels are still the same
        gone = res["after destroying a subgroup"]
        for what in ("channels", "channel segments"):
            assert gone[what] == before[what], (what, describe(results))
        if transports == "tcp":
            assert before["channel segments"] == 0 and made["fast-path segments"] == 0
        else:      # one slot segment per group of 2 or more ranks; the destroyed one's unmapped
            assert made["fast-path segments"] > before["fast-path segments"], describe(results)
            assert gone["fast-path segments"] == made["fast-path segments"] - 1
        # every reduction is over 2 ranks (a + b == b + a in any algorithm): bit for bit
        assert res["exact"], describe(results)
        assert res["checked"] >= 30, describe(results)


def test_pycoll_group_under_another_default_backend():
    """new_group(backend="pycoll") under a Gloo default group: no channels to share, so the
    group bootstraps a communicator of its own; it works and is released on destroy."""
    results = run_scenario("own_channels", 2, timeout=90)
    _ok(results)
    for res in results:
        assert res["own"] is True, describe(results)     # its own channels, not a subgroup
        assert res["leftovers"] == {}, describe(results)
