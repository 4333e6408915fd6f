"""Launch-environment detection: every launcher's variables, precedence, overrides, errors."""

import dataclasses
import os
import subprocess
import sys

import pytest

from pycoll.launch import DEFAULT_MASTER_PORT, LaunchInfo, detect_launch, resolve_launch

pytestmark = pytest.mark.timeout(30)


def test_empty_environment_is_a_single_process_job():
    info = detect_launch({})
    assert info == LaunchInfo(
        rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr=None,
        master_port=None, launcher="none", store_is_external=False, token=None,
    )
    assert info.is_single_process


def test_launch_info_is_frozen():
    info = detect_launch({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rank = 3  # type: ignore[misc]


def test_defaults_to_os_environ(monkeypatch):
    for k in ("PYCOLL_RANK", "PYCOLL_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
              "PYCOLL_MASTER_PORT", "PYCOLL_STORE_EXTERNAL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    info = detect_launch()
    assert (info.launcher, info.rank, info.world_size, info.master_addr) == \
        ("openmpi", 1, 2, "10.0.0.1")


# ---------------------------------------------------------------------------------------------
# each launcher


PYCOLL_ENV = {
    "PYCOLL_RANK": "2", "PYCOLL_WORLD_SIZE": "4", "PYCOLL_LOCAL_RANK": "2",
    "PYCOLL_LOCAL_WORLD_SIZE": "4", "PYCOLL_MASTER_ADDR": "127.0.0.1",
    "PYCOLL_MASTER_PORT": "41000", "PYCOLL_STORE_EXTERNAL": "1", "PYCOLL_TOKEN": "ab" * 16,
    # pycoll.run also sets the torchrun variables, with torch's own MASTER_PORT
    "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41001",
}


def test_pycoll_run_environment():
    info = detect_launch(PYCOLL_ENV)
    assert info == LaunchInfo(
        rank=2, world_size=4, local_rank=2, local_world_size=4, master_addr="127.0.0.1",
        master_port=41000, launcher="pycoll", store_is_external=True, token="ab" * 16,
    )


def test_pycoll_vars_without_external_store():
    env = {"PYCOLL_RANK": "0", "PYCOLL_WORLD_SIZE": "2", "PYCOLL_MASTER_ADDR": "h0",
           "PYCOLL_MASTER_PORT": "5000"}
    info = detect_launch(env)
    assert info.launcher == "pycoll" and not info.store_is_external
    assert (info.master_addr, info.master_port) == ("h0", 5000)
    assert info.local_rank is None and info.local_world_size is None


TORCHRUN_ENV = {
    "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "MASTER_ADDR": "node0.example", "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True",
}


def test_torchrun_environment_uses_master_port_plus_one():
    info = detect_launch(TORCHRUN_ENV)
    assert info == LaunchInfo(
        rank=3, world_size=8, local_rank=1, local_world_size=2, master_addr="node0.example",
        master_port=29501, launcher="torchrun", store_is_external=False, token=None,
    )


def test_torchrun_pycoll_master_port_overrides_plus_one():
    info = detect_launch({**TORCHRUN_ENV, "PYCOLL_MASTER_PORT": "31000", "PYCOLL_TOKEN": "t"})
    assert info.master_port == 31000
    assert info.token == "t"


def test_torchrun_pycoll_master_addr_overrides():
    info = detect_launch({**TORCHRUN_ENV, "PYCOLL_MASTER_ADDR": "10.1.1.1"})
    assert info.master_addr == "10.1.1.1" and info.master_port == 29501


def test_torchrun_master_port_65535_has_no_next_port():
    with pytest.raises(ValueError,
                       match=r"MASTER_PORT.*torchrun.*PYCOLL_MASTER_PORT|torchrun.*MASTER_PORT"):
        detect_launch({**TORCHRUN_ENV, "MASTER_PORT": "65535"})


def test_torchrun_missing_master_addr():
    env = dict(TORCHRUN_ENV)
    del env["MASTER_ADDR"]
    with pytest.raises(ValueError, match=r"torchrun.*MASTER_ADDR"):
        detect_launch(env)


def test_torchrun_missing_master_port():
    env = dict(TORCHRUN_ENV)
    del env["MASTER_PORT"]
    with pytest.raises(ValueError, match=r"torchrun.*MASTER_PORT"):
        detect_launch(env)


def test_torchrun_world_size_one_needs_no_address():
    info = detect_launch({"RANK": "0", "WORLD_SIZE": "1"})
    assert info.launcher == "torchrun" and info.world_size == 1 and info.master_addr is None


OMPI_ENV = {
    "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "3", "MASTER_ADDR": "10.0.0.7",
}


def test_openmpi_environment():
    info = detect_launch(OMPI_ENV)
    assert info == LaunchInfo(
        rank=5, world_size=6, local_rank=2, local_world_size=3, master_addr="10.0.0.7",
        master_port=DEFAULT_MASTER_PORT, launcher="openmpi", store_is_external=False, token=None,
    )
    assert DEFAULT_MASTER_PORT == 29500


def test_openmpi_master_port_used_directly():
    info = detect_launch({**OMPI_ENV, "MASTER_PORT": "1234"})
    assert info.master_port == 1234


def test_openmpi_multi_host_without_address_is_an_error():
    env = dict(OMPI_ENV)
    del env["MASTER_ADDR"]
    with pytest.raises(ValueError, match=r"openmpi.*MASTER_ADDR"):
        detect_launch(env)


def test_openmpi_single_host_defaults_to_loopback():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    info = detect_launch(env)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 29500)


MPICH_ENV = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
             "PYCOLL_MASTER_ADDR": "h1", "PYCOLL_MASTER_PORT": "4000"}


def test_mpich_environment():
    info = detect_launch(MPICH_ENV)
    assert info == LaunchInfo(
        rank=1, world_size=4, local_rank=1, local_world_size=2, master_addr="h1",
        master_port=4000, launcher="mpich", store_is_external=False, token=None,
    )


def test_mpich_without_local_vars():
    info = detect_launch({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_ADDR": "h"})
    assert info.launcher == "mpich" and info.local_rank is None and info.local_world_size is None


SLURM_ENV = {"SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3",
             "SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "1", "MASTER_ADDR": "gpu01",
             "SLURM_STEP_ID": "0"}


def test_slurm_environment():
    info = detect_launch(SLURM_ENV)
    assert info == LaunchInfo(
        rank=7, world_size=8, local_rank=3, local_world_size=4, master_addr="gpu01",
        master_port=29500, launcher="slurm", store_is_external=False, token=None,
    )


def test_slurm_master_from_the_node_list_and_port_from_the_job_id():
    env = dict(SLURM_ENV, SLURM_STEP_NODELIST="gpu[07-08,11]", SLURM_JOB_ID="123456")
    del env["MASTER_ADDR"]
    info = detect_launch(env)
    assert info.master_addr == "gpu07" and info.master_port == 15000 + 3456
    env["MASTER_PORT"] = "31000"
    assert detect_launch(env).master_port == 31000


def test_slurm_hostlists():
    from pycoll.launch.slurm import expand_hostlist
    assert expand_hostlist("node[01-04,07]") == ["node01", "node02", "node03", "node04",
                                                 "node07"]
    assert expand_hostlist("a1,b[9-10],c") == ["a1", "b9", "b10", "c"]
    assert expand_hostlist("rack[1-2]-n[1-2]") == ["rack1-n1", "rack1-n2", "rack2-n1",
                                                   "rack2-n2"]
    for bad in ("n[1-", "n[3-1]", "n[a-b]", "n]1["):
        with pytest.raises(ValueError):
            expand_hostlist(bad)


def test_slurm_batch_script_without_srun_fails_fast():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_STEP_ID"}
    env["SLURM_PROCID"] = "0"
    with pytest.raises(ValueError, match="srun"):
        detect_launch(env)
    env["SLURM_STEP_ID"] = "4294967294"          # the batch step itself
    with pytest.raises(ValueError, match="srun"):
        detect_launch(env)


def test_srun_with_pmi2_is_slurm_not_mpich():
    env = dict(SLURM_ENV, PMI_RANK="7", PMI_SIZE="8", SLURM_STEP_NODELIST="gpu[01-02]")
    del env["MASTER_ADDR"]
    info = detect_launch(env)
    assert info.launcher == "slurm" and info.master_addr == "gpu01"


def test_launchers_pycoll_does_not_read_are_an_error():
    with pytest.raises(ValueError, match="HOROVOD_RANK"):
        detect_launch({"HOROVOD_RANK": "1"})


def test_pmix_alone_has_no_world_size_and_says_what_to_do():
    with pytest.raises(ValueError, match="PMIX_RANK.*mpi4py"):
        detect_launch({"PMIX_RANK": "1", "PMIX_NAMESPACE": "prterun-x-1@1"})


def test_slurm_without_master_addr_is_a_clear_error():
    env = dict(SLURM_ENV)
    del env["MASTER_ADDR"]
    with pytest.raises(ValueError) as e:
        detect_launch(env)
    msg = str(e.value)
    assert "slurm" in msg and "MASTER_ADDR" in msg and "PYCOLL_MASTER_ADDR" in msg


def test_slurm_tasks_per_node_list():
    env = {k: v for k, v in SLURM_ENV.items() if k != "SLURM_NTASKS_PER_NODE"}
    env.update({"SLURM_TASKS_PER_NODE": "5,3", "SLURM_NTASKS": "8", "SLURM_PROCID": "6",
                "SLURM_LOCALID": "1"})
    assert detect_launch(env).local_world_size == 3
    env["SLURM_TASKS_PER_NODE"] = "2(x4)"
    assert detect_launch(env).local_world_size == 2
    env["SLURM_TASKS_PER_NODE"] = "garbage"
    assert detect_launch(env).local_world_size is None


def test_slurm_single_task():
    info = detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert info.launcher == "slurm" and info.world_size == 1 and info.master_addr is None


# ---------------------------------------------------------------------------------------------
# precedence


def test_priority_pycoll_over_torchrun_over_mpi_over_slurm():
    env = {**SLURM_ENV, **MPICH_ENV, **OMPI_ENV, **TORCHRUN_ENV}
    assert detect_launch(env).launcher == "torchrun"
    env.update({"PYCOLL_RANK": "0", "PYCOLL_WORLD_SIZE": "2", "PYCOLL_MASTER_PORT": "9"})
    assert detect_launch(env).launcher == "pycoll"
    assert detect_launch({**SLURM_ENV, **MPICH_ENV, **OMPI_ENV}).launcher == "openmpi"
    assert detect_launch({**SLURM_ENV, **MPICH_ENV}).launcher == "mpich"


def test_mpi_inside_slurm_allocation_is_mpi():
    # mpirun inside sbatch: every rank inherits the batch step's SLURM_PROCID=0
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "PMI_RANK": "3", "PMI_SIZE": "4",
           "MASTER_ADDR": "h"}
    info = detect_launch(env)
    assert (info.launcher, info.rank, info.world_size) == ("mpich", 3, 4)


def test_pycoll_master_vars_beat_master_vars():
    info = detect_launch({**OMPI_ENV, "MASTER_PORT": "1", "PYCOLL_MASTER_PORT": "2",
                          "PYCOLL_MASTER_ADDR": "a"})
    assert (info.master_addr, info.master_port) == ("a", 2)


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("YES", True),
                                            ("0", False), ("", False), ("off", False)])
def test_store_external_flag_with_any_launcher(value, expected):
    assert detect_launch({**OMPI_ENV, "PYCOLL_STORE_EXTERNAL": value}).store_is_external is expected


def test_store_external_flag_garbage():
    with pytest.raises(ValueError, match="PYCOLL_STORE_EXTERNAL"):
        detect_launch({**OMPI_ENV, "PYCOLL_STORE_EXTERNAL": "maybe"})


def test_empty_token_is_none():
    assert detect_launch({"PYCOLL_TOKEN": ""}).token is None


# ---------------------------------------------------------------------------------------------
# explicit arguments


def test_arguments_without_environment():
    info = resolve_launch(rank=1, world_size=3, env={})
    assert (info.rank, info.world_size, info.launcher) == (1, 3, "none")
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 29500)
    assert info.local_rank is None and not info.store_is_external


def test_arguments_override_environment():
    info = resolve_launch(rank=0, world_size=2, master_addr="x", master_port=7, env=TORCHRUN_ENV)
    assert (info.rank, info.world_size, info.master_addr, info.master_port) == (0, 2, "x", 7)
    assert info.launcher == "torchrun"


def test_argument_master_port_is_used_as_given_under_torchrun():
    assert resolve_launch(master_port=29500, env=TORCHRUN_ENV).master_port == 29500


def test_argument_overrides_a_broken_variable():
    env = {**OMPI_ENV, "OMPI_COMM_WORLD_RANK": "garbage"}
    assert resolve_launch(rank=4, env=env).rank == 4
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK"):
        resolve_launch(env=env)


def test_arguments_partly_override():
    info = resolve_launch(master_addr="override", env=MPICH_ENV)
    assert (info.rank, info.world_size, info.master_addr, info.master_port) == \
        (1, 4, "override", 4000)


def test_single_process_by_arguments():
    info = resolve_launch(rank=0, world_size=1, env={})
    assert info.world_size == 1 and info.master_addr is None


def test_rank_without_world_size_argument():
    with pytest.raises(ValueError, match="world_size"):
        resolve_launch(rank=0, env={})
    with pytest.raises(ValueError, match="rank"):
        resolve_launch(world_size=2, env={})


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(rank=2, world_size=2), r"argument rank=2.*\[0, 2\)"),
    (dict(rank=-1, world_size=2), r"argument rank=-1"),
    (dict(rank=0, world_size=0), r"argument world_size=0.*at least 1"),
    (dict(rank=0, world_size=2, master_port=70000), r"argument master_port=70000"),
    (dict(rank=0, world_size=2, master_port=0), r"argument master_port=0"),
    (dict(rank="x", world_size=2), r"argument rank='x'.*not an integer"),
    (dict(rank=True, world_size=2), r"argument rank=True.*not an integer"),
    (dict(rank=0, world_size=2, master_addr=""), r"argument master_addr.*empty"),
])
def test_invalid_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern) as e:
        resolve_launch(env={}, **kwargs)
    assert "launcher detected: none" in str(e.value)


def test_string_arguments_that_parse_are_accepted():
    info = resolve_launch(rank="1", world_size="2", master_port="99", env={})
    assert (info.rank, info.world_size, info.master_port) == (1, 2, 99)


# ---------------------------------------------------------------------------------------------
# error messages name the variable and the launcher


@pytest.mark.parametrize("env,var,launcher", [
    ({"PYCOLL_RANK": "a", "PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK", "pycoll"),
    ({"PYCOLL_RANK": "0"}, "PYCOLL_WORLD_SIZE", "pycoll"),
    ({"PYCOLL_WORLD_SIZE": "2"}, "PYCOLL_RANK", "pycoll"),
    ({**PYCOLL_ENV, "PYCOLL_MASTER_PORT": "port"}, "PYCOLL_MASTER_PORT", "pycoll"),
    ({"PYCOLL_RANK": "0", "PYCOLL_WORLD_SIZE": "2", "PYCOLL_MASTER_PORT": "1"},
     "PYCOLL_MASTER_ADDR", "pycoll"),
    ({**TORCHRUN_ENV, "RANK": "8"}, "RANK", "torchrun"),
    ({**TORCHRUN_ENV, "WORLD_SIZE": "0"}, "WORLD_SIZE", "torchrun"),
    ({**TORCHRUN_ENV, "WORLD_SIZE": "-3"}, "WORLD_SIZE", "torchrun"),
    ({**TORCHRUN_ENV, "LOCAL_RANK": "2"}, "LOCAL_RANK", "torchrun"),
    ({**TORCHRUN_ENV, "LOCAL_WORLD_SIZE": "9"}, "LOCAL_WORLD_SIZE", "torchrun"),
    ({**TORCHRUN_ENV, "MASTER_PORT": "http"}, "MASTER_PORT", "torchrun"),
    ({"RANK": "0"}, "WORLD_SIZE", "torchrun"),
    ({**OMPI_ENV, "OMPI_COMM_WORLD_SIZE": "1.5"}, "OMPI_COMM_WORLD_SIZE", "openmpi"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK", "openmpi"),
    ({**OMPI_ENV, "OMPI_COMM_WORLD_LOCAL_RANK": "x"}, "OMPI_COMM_WORLD_LOCAL_RANK", "openmpi"),
    ({**MPICH_ENV, "PMI_RANK": "4"}, "PMI_RANK", "mpich"),
    ({"PMI_RANK": "0"}, "PMI_SIZE", "mpich"),
    ({**MPICH_ENV, "MPI_LOCALNRANKS": "0"}, "MPI_LOCALNRANKS", "mpich"),
    ({**MPICH_ENV, "PYCOLL_MASTER_PORT": "65536"}, "PYCOLL_MASTER_PORT", "mpich"),
    ({**SLURM_ENV, "SLURM_PROCID": "8"}, "SLURM_PROCID", "slurm"),
    ({"SLURM_PROCID": "0"}, "SLURM_NTASKS", "slurm"),
    ({**SLURM_ENV, "SLURM_LOCALID": "4"}, "SLURM_LOCALID", "slurm"),
    ({**SLURM_ENV, "MASTER_PORT": ""}, "MASTER_PORT", "slurm"),
])
def test_error_names_variable_and_launcher(env, var, launcher):
    with pytest.raises(ValueError) as e:
        detect_launch(env)
    msg = str(e.value)
    assert var in msg, msg
    assert f"launcher detected: {launcher}" in msg, msg


def test_whitespace_around_numbers_is_accepted():
    info = detect_launch({"PMI_RANK": " 1 ", "PMI_SIZE": "2\n", "MASTER_ADDR": " h "})
    assert (info.rank, info.world_size, info.master_addr) == (1, 2, "h")


def test_import_is_cheap_and_standalone():
    # environment.py is standard-library only (loadable on its own), and importing
    # pycoll.launch does not load the launcher (subprocess, threads) or rendezvous.
    code = (
        "import sys, importlib.util, pycoll.launch.environment as e\n"
        "before = set(sys.modules)\n"
        "spec = importlib.util.spec_from_file_location('standalone_env', e.__file__)\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['standalone_env'] = m; "
        "spec.loader.exec_module(m)\n"
        "assert m.detect_launch({}).launcher == 'none'\n"
        "new = sorted(n for n in set(sys.modules) - before "
        "if n.split('.')[0] in ('pycoll', 'rendezvous', 'numpy', 'torch'))\n"
        "import pycoll.launch\n"
        "print(new, 'pycoll.launch.launcher' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False", out.stdout


def test_init_from_an_mpi_communicator():
    """pycoll.init(comm=MPI.COMM_WORLD) under mpiexec: rank 0's store address and the job
    secret travel over MPI (no MASTER_ADDR, no PYCOLL_TOKEN)."""
    _mpiexec_allreduce("import numpy as np\nfrom mpi4py import MPI\nimport pycoll\n"
                       "c = pycoll.init(comm=MPI.COMM_WORLD, timeout=30)\n")


def _mpiexec_allreduce(setup: str) -> None:
    """Run ``setup`` (which leaves a communicator in ``c``) and an allreduce on 3 ranks of
    the mpich wheel's mpiexec; every rank must get the sum."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip("mpiexec (mpich wheel) not installed")
    pytest.importorskip("mpi4py")
    code = setup + ("a = np.ones(2) * (c.rank + 1); c.allreduce(a)\n"
                    "print('RESULT', c.rank, c.size, a.tolist(), flush=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYCOLL_", "MASTER_"))}
    proc = subprocess.run([mpiexec, "-launcher", "fork", "-hosts", "127.0.0.1", "-n", "3",
                           sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("[6.0, 6.0]") == 3, proc.stdout


def test_plain_init_under_a_pmix_launcher_bootstraps_over_mpi():
    """A PMIx launcher (prterun, Open MPI 5's mpirun) sets PMIX_RANK and no world size: plain
    ``pycoll.init()`` bootstraps over MPI.COMM_WORLD. Real MPI (the mpich wheel's hydra)
    starts the ranks; once MPI is up, each rank's environment is made to look like a PMIx
    launch (PMI_* and hydra's local-rank variables removed, PMIX_RANK set)."""
    _mpiexec_allreduce("import os\nimport numpy as np\nfrom mpi4py import MPI\nimport pycoll\n"
                       "os.environ['PMIX_RANK'] = os.environ['PMI_RANK']\n"
                       "for k in [k for k in os.environ if k.startswith(('PMI_', 'MPI_LOCAL'))]:\n"
                       "    del os.environ[k]\n"
                       "from pycoll.launch.environment import launcher_name\n"
                       "assert launcher_name() == 'pmix'\n"
                       "c = pycoll.init(timeout=30)\n")
