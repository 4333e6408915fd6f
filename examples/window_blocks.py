"""Block transfer between "inference workers" through a one-sided window (docs/windows.md).

Rank 0 puts fixed-size blocks into rank 1's window and signals once per block; rank 1 waits
for the running count and checks each block.
Run: python -m pycoll.run -n 2 examples/window_blocks.py
"""
from __future__ import annotations

import numpy as np

import pycoll

BLOCK, BLOCKS = 1024, 8


def main(comm: pycoll.Communicator) -> int:
    inbox = np.zeros(BLOCK * BLOCKS, dtype=np.float32)   # rank 1 receives here
    with comm.window(inbox) as win:
        if comm.rank == 0:
            for b in range(BLOCKS):
                block = np.full(BLOCK, b, dtype=np.float32)
                win.put(block, target=1, offset=b * BLOCK)   # complete when it returns
                win.signal(1)                                # "block b is there"
        elif comm.rank == 1:
            for b in range(BLOCKS):
                win.wait_signal(b + 1, timeout=60)           # counters only grow
                assert (inbox[b * BLOCK:(b + 1) * BLOCK] == b).all()
    return BLOCKS if comm.rank == 1 else 0


if __name__ == "__main__":
    print(f"rank {pycoll.get_rank()}: {main(pycoll.init())} blocks received")
    pycoll.finalize()
