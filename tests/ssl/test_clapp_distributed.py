"""CLAPPEncoder under ``torchrun``: sharding, gradient averaging, identical ranks."""

from pathlib import Path

import pytest
import torch

from mlpapers.ssl.clapp._distributed import dist_world, shard
from tests.ssl._torchrun import run_two_ranks

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


def test_torchrun_two_ranks_end_identical_and_loss_decreases(tmp_path):
    run_two_ranks(SCRIPT, str(tmp_path))
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


@pytest.mark.parametrize("outcomes, passes", [
    ([(0, "")], True),
    ([(1, "exitcode  : -6 (pid: 2)"), (0, "")], True),       # native crash, then clean
    ([(1, "exitcode  : -6 (pid: 2)")] * 2, False),            # crashes twice
    ([(1, "exitcode  : 1 (pid: 2)"), (0, "")], False),        # Python error: no relaunch
])
def test_torchrun_launcher_relaunches_once_only_after_a_native_crash(monkeypatch, outcomes,
                                                                      passes):
    import subprocess

    from tests.ssl import _torchrun

    runs = iter(outcomes)

    def launch(*args):
        returncode, stderr = next(runs)
        return subprocess.CompletedProcess([], returncode, stdout="", stderr=stderr)

    monkeypatch.setattr(_torchrun, "_launch", launch)
    if passes:
        _torchrun.run_two_ranks(SCRIPT)
    else:
        with pytest.raises(AssertionError):
            _torchrun.run_two_ranks(SCRIPT)
