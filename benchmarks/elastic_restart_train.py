"""The user's job of benchmarks/elastic_restart_baseline.py: DDP on CPU with Gloo, as a torchrun
user writes it, that resumes from its last checkpoint when torchrun restarts it.

A small MLP (4 layers of 256, Adam) learns a fixed random map from synthetic inputs; each
step's batch depends only on the seed, the step and the rank, so a resumed job sees the data
it would have seen. Rank 0 checkpoints model + optimizer + step every K steps (a temporary
file renamed over the last one, so a kill mid-save leaves the previous checkpoint whole).

Only the event log is the benchmark's: each worker appends `time event value rank restart`
lines (time.time(), one clock for every process on the host) to LOGDIR/rank<R>.log: its
process start (from /proc), the script's first line (value: the pid), the end of the imports,
of init_process_group, of building the model and the optimizer, of the checkpoint load (value:
the step resumed from), of the DDP wrap, and every step completed (value: the step).

    python -m torch.distributed.run --standalone --nproc-per-node N --max-restarts 1 \\
        elastic_restart_train.py LOGDIR TOTAL_STEPS CKPT_EVERY SEED
"""
import time

T_SCRIPT = time.time()
import os  # noqa: E402
import sys  # noqa: E402


def process_start() -> float:
    """This process's creation time on the time.time() clock: /proc/self/stat has it in clock
    ticks since boot (CLOCK_BOOTTIME), 10 ms resolution."""
    with open("/proc/self/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


OUT, TOTAL, EVERY, SEED = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
RANK = int(os.environ["RANK"])
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
LOG = open(os.path.join(OUT, f"rank{RANK}.log"), "a", buffering=1)  # noqa: SIM115


def mark(event: str, value: int = 0, t: float | None = None) -> None:
    LOG.write(f"{time.time() if t is None else t:.6f} {event} {value} {RANK} {RESTART}\n")


mark("start", 0, process_start())
mark("script", os.getpid(), T_SCRIPT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

mark("imports")
dist.init_process_group("gloo")
mark("init_process_group")

torch.manual_seed(SEED)
WIDTH, BATCH = 256, 32
model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
teacher = torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
mark("model")
CKPT = os.path.join(OUT, "checkpoint.pt")
step = 0
if os.path.exists(CKPT):
    state = torch.load(CKPT, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    step = state["step"]
mark("checkpoint", step)
ddp = DDP(model)
mark("ddp")

while step < TOTAL:
    step += 1
    gen = torch.Generator().manual_seed(SEED * 1_000_003 + step * 1009 + RANK)
    x = torch.randn(BATCH, WIDTH, generator=gen)
    loss = F.mse_loss(ddp(x), torch.tanh(x @ teacher))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    mark("step", step)
    if RANK == 0 and step % EVERY == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step}, CKPT + ".tmp")
        os.replace(CKPT + ".tmp", CKPT)
dist.destroy_process_group()
