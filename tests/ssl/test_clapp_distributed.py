"""CLAPPEncoder under ``torchrun``: sharding, gradient averaging, identical ranks."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlpapers.ssl.clapp._distributed import dist_world, shard

SCRIPT = Path(__file__).with_name("_ddp_script.py")


@pytest.mark.parametrize("n, world", [(96, 2), (7, 2), (10, 3), (5, 4)])
def test_shard_covers_every_index_with_equal_lengths(n, world):
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    parts = [shard(perm, r, world) for r in range(world)]
    assert len({len(p) for p in parts}) == 1                      # same number of steps
    assert len(parts[0]) == -(-n // world)
    assert set(torch.cat(parts).tolist()) == set(range(n))       # every image is used
    if n % world == 0:                                            # then shards are disjoint
        assert sorted(torch.cat(parts).tolist()) == list(range(n))


def test_single_process_is_not_distributed():
    assert dist_world() is None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_ranks_end_identical_and_loss_decreases(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(SCRIPT),
           str(tmp_path)]
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:                      # pragma: no cover
        pytest.fail(f"torchrun timed out:\n{exc.stdout}\n{exc.stderr}")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2
    for key in ("encoder", "heads"):
        assert r0[key].keys() == r1[key].keys()
        for name in r0[key]:
            # different shards and augmentations per rank: only the gradient
            # all-reduce keeps the parameters bit-identical
            assert torch.equal(r0[key][name], r1[key][name]), (key, name)
    assert r0["history"] == r1["history"]                         # global loss history
    assert r0["history"][-1] < r0["history"][0]
