"""Every ``PYCOLL_*`` environment variable, its default and what it does: the one table.

``python -m pycoll.info`` prints it with this process's values; ``tests/test_info.py``
checks that every ``PYCOLL_`` name in the source and in docs/environment.md is here, so a
new variable cannot be added to the code or the docs without this table learning of it.
The readers themselves stay where the value is used (``pycoll.envvars``'s functions); the
defaults written here are the ones those readers pass.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """One variable: ``default`` as a person would write it ('' : unset means off / none)."""

    name: str
    section: str
    default: str
    meaning: str
    secret: bool = False


def _table(section: str, *rows: tuple[str, str, str]) -> list[Variable]:
    return [Variable(name, section, default, meaning,
                     secret=name == "PYCOLL_TOKEN") for name, default, meaning in rows]


VARIABLES: list[Variable] = [
    *_table(
        "launch",
        ("PYCOLL_RANK", "", "this process's rank (set by python -m pycoll.run)"),
        ("PYCOLL_WORLD_SIZE", "", "the job's rank count (set by python -m pycoll.run)"),
        ("PYCOLL_LOCAL_RANK", "", "rank on this host (set by python -m pycoll.run)"),
        ("PYCOLL_LOCAL_WORLD_SIZE", "", "ranks on this host (set by python -m pycoll.run)"),
        ("PYCOLL_MASTER_ADDR", "", "rendezvous store address (overrides MASTER_ADDR)"),
        ("PYCOLL_MASTER_PORT", "", "rendezvous store port (overrides MASTER_PORT)"),
        ("PYCOLL_STORE_EXTERNAL", "0", "1: a store already runs there; rank 0 starts none"),
        ("PYCOLL_ELASTIC", "", "1: a lost rank does not end the job (set by python -m "
                               "pycoll.run --elastic)"),
        ("PYCOLL_JOIN", "0", "1: pycoll.init() joins the running job once its ranks call "
                             "grow() (set in a pycoll.run --max-restarts replacement)"),
        ("PYCOLL_REPLACES", "", "the rank a pycoll.run --max-restarts replacement replaces "
                                "(information for the program)"),
        ("PYCOLL_TOKEN", "", "job secret: store authentication, HMAC of TCP connections"),
        ("PYCOLL_TLS_CERT", "", "PEM certificate of this process (TLS with KEY and CA)"),
        ("PYCOLL_TLS_KEY", "", "PEM private key of this process"),
        ("PYCOLL_TLS_CA", "", "PEM CA of the job's certificates"),
    ),
    *_table(
        "transports",
        ("PYCOLL_TRANSPORTS", "cuda_ipc,shm,verbs,tcp", "ordered allow-list of transports"),
        ("PYCOLL_SOCKET_IFNAME", "", "interface for TCP data (NCCL syntax); default: route "
                                     "to the master"),
        ("PYCOLL_SOCKET_NSOCKS", "1", "TCP connections per peer pair (1-16)"),
        ("PYCOLL_CUDA_SIMULATOR", "0", "1: device memory on pycoll's CPU simulator of CUDA "
                                       "(CI; never a GPU run)"),
        ("PYCOLL_CUDA_SIMULATOR_DELAY_US", "200", "simulator: longest random delay of "
                                                  "queued device work"),
        ("PYCOLL_SOCKET_FAMILY", "", "ipv4 or ipv6; default: the master address's"),
        ("PYCOLL_SOCKET_BUFFER", "4194304", "SO_SNDBUF/SO_RCVBUF bytes"),
        ("PYCOLL_SOCKET_DEAD_MS", "10000", "a dead tcp link is lost after about this long"),
        ("PYCOLL_SHM_SLOT_BYTES", "262144", "bytes per shm inbox slot"),
        ("PYCOLL_SHM_SLOTS", "8", "slots per shm inbox"),
        ("PYCOLL_SHM_CMA", "1", "0: no cross-memory attach (process_vm_readv)"),
        ("PYCOLL_SHM_CMA_THRESHOLD", "2097152", "smallest message sent by cross-memory "
                                                "attach (1048576 with more ranks than cores)"),
        ("PYCOLL_SHM_PREFIX", "pycoll", "first part of shm segment names: processes sweep "
                                        "only leftovers of their own prefix"),
        ("PYCOLL_SPIN_US", "50", "microseconds a waiter spins (0 with more ranks than cores)"),
        ("PYCOLL_IB_HCA", "", "RDMA devices/ports for verbs (NCCL_IB_HCA syntax); all"),
        ("PYCOLL_IB_GID_INDEX", "", "GID index; default: first RoCE v2 IPv4-mapped GID"),
        ("PYCOLL_IB_FABRIC", "", "fabric name; default: roce, or the IB subnet prefix"),
        ("PYCOLL_IB_EAGER_MAX", "65536", "verbs eager limit (bytes)"),
        ("PYCOLL_IB_EAGER_SLOTS", "16", "verbs ring buffers (credits) per peer"),
        ("PYCOLL_IB_QPS_PER_PEER", "1", "verbs data queue pairs per peer"),
        ("PYCOLL_IB_TIMEOUT", "14", "verbs RC ack timeout exponent"),
        ("PYCOLL_IB_RETRY_CNT", "7", "verbs RC retries"),
        ("PYCOLL_IB_REG_CACHE_BYTES", "4294967296", "verbs registration cache bytes"),
        ("PYCOLL_IB_REG_CACHE_ENTRIES", "1024", "verbs registration cache entries (0: none)"),
    ),
    *_table(
        "fast path",
        ("PYCOLL_FASTPATH", "1", "0: no compiled one-host path on this rank"),
        ("PYCOLL_FASTPATH_C", "1", "0: the fast path's small calls run their Python part in "
                                   "Python, not compiled (fastpath/callpath.py)"),
        ("PYCOLL_FASTPATH_BYTES", "262144", "largest allreduce run in one slot"),
        ("PYCOLL_FASTPATH_CMA_BYTES", "16384", "smallest broadcast copied once by "
                                               "cross-memory attach (0: never)"),
        ("PYCOLL_FASTPATH_CHUNKED_BYTES", "", "largest native allreduce run chunk by chunk "
                                              "(unset: no limit; 0: never)"),
    ),
    *_table(
        "job behaviour",
        ("PYCOLL_DETERMINISTIC", "0", "1: reducing calls fold in rank order"),
        ("PYCOLL_ACCUMULATE", "fp32", "float16/bfloat16 sums accumulate in fp32 or dtype"),
        ("PYCOLL_COMPRESS", "none", "wire format of float collectives: bf16, fp16, fp8, int8"),
        ("PYCOLL_INTEGRITY", "off", "end-to-end integrity checks: off, on, sample:N"),
        ("PYCOLL_ALGO", "", "force algorithms: allreduce=ring,broadcast=pipeline"),
        ("PYCOLL_SEGMENT_BYTES", "", "pipelining segment bytes (default: the transport's)"),
        ("PYCOLL_LINK_PROBE", "1", "measure intra/inter-node links at init on several nodes"),
        ("PYCOLL_INTER_NODE_GBPS", "", "declared inter-node bandwidth (GB/s)"),
        ("PYCOLL_INTER_NODE_LATENCY_US", "50", "declared inter-node latency (us)"),
        ("PYCOLL_VIRTUAL_NODE_SIZE", "", "pretend every k consecutive ranks share a node"),
        ("PYCOLL_HOST_ID", "", "this process's node identity (default: hostname + boot id)"),
    ),
    *_table(
        "debugging",
        ("PYCOLL_DEBUG", "", "WARN, INFO or DETAIL logging (DETAIL: mismatch detection)"),
        ("PYCOLL_FLIGHT_RECORDER", "500", "recent collectives kept per communicator"),
        ("PYCOLL_TRACE_DIR", "", "flight-recorder dumps (default $TMPDIR/pycoll-traces-<uid>)"),
        ("PYCOLL_ABORT_POLL_MS", "100", "how often an idle wait looks for an abort record"),
        ("PYCOLL_STATUS", "1", "0: no status port (python -m pycoll.status cannot see the rank)"),
        ("PYCOLL_STRAGGLER_LOG", "0", "seconds: rank 0 logs the job's stragglers this often"),
        ("PYCOLL_METRICS_PORT", "", "OpenMetrics: rank r serves on this port + r (0: a free one)"),
        ("PYCOLL_METRICS_ADDR", "127.0.0.1", "the address the metrics endpoint binds"),
    ),
    *_table(
        "testing hooks",
        ("PYCOLL_TEST_FLIP", "", "test hook: flip a bit in a received message"),
        ("PYCOLL_BENCH_CORRUPT_RANK", "", "bench hook: corrupt this rank's result"),
        ("PYCOLL_TEST_HOST", "", "set by pycoll.testing.hosts: this namespace host's index"),
        ("PYCOLL_TEST_HOSTS", "", "set by pycoll.testing.hosts: every host's address"),
    ),
]

BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}


def current(env: dict[str, str] | None = None) -> list[dict[str, object]]:
    """Each variable with this process's value (None: unset); a secret shows only that it
    is set, never its value. Unknown ``PYCOLL_*`` names in the environment (typos) are
    listed last with section "unknown": pycoll ignores them."""
    env = dict(os.environ if env is None else env)
    rows: list[dict[str, object]] = []
    for v in VARIABLES:
        value = env.get(v.name)
        if value is not None and v.secret:
            value = "(set, hidden)"
        rows.append({"name": v.name, "section": v.section, "value": value,
                     "default": v.default or None, "meaning": v.meaning})
    for name in sorted(env):
        if name.startswith("PYCOLL_") and name not in BY_NAME:
            rows.append({"name": name, "section": "unknown", "value": env[name],
                         "default": None, "meaning": "not a pycoll variable (a typo?)"})
    return rows
