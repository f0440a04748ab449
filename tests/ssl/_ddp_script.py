"""Worker run by ``tests/ssl/test_clapp_distributed.py`` under ``torchrun`` (gloo, CPU).

Usage: ``python -m torch.distributed.run --nproc_per_node=2 _ddp_script.py OUT_DIR``.
Each rank fits the same small CLAPPEncoder on its shard and saves its parameters,
its loss history and the world size to ``OUT_DIR/rank{r}.pt``.
"""

import os
import sys

import torch
import torch.distributed as dist

from mlpapers.datasets import make_shifted_digits
from mlpapers.ssl import CLAPPEncoder


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    X, _ = make_shifted_digits(n_samples=96, random_state=0)
    # random_state=None on purpose: rank 0's initialisation and shuffling seed must be
    # broadcast for the ranks to agree.
    enc = CLAPPEncoder(architecture="tiny", augment="light", n_epochs=4, batch_size=16,
                       lr=3e-3, random_state=None).fit(X)
    state = {
        "encoder": enc.encoder_.state_dict(),
        "heads": enc.heads_.state_dict(),
        "history": [h["loss"] for h in enc.history_],
        "world": world,
    }
    torch.save(state, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
