"""Data-parallel fitting when :mod:`torch.distributed` is initialised (e.g. ``torchrun``).

Every process (rank) holds a full copy of the encoder and its heads. Per epoch all
ranks draw the *same* permutation of the training images (from a seed broadcast by
rank 0) and each takes every ``world_size``-th image of it, padded by wrapping around
so all shards have the same length (as :class:`torch.utils.data.DistributedSampler`
with ``drop_last=False``). After each backward pass the gradients of all trainable
parameters are averaged across ranks with one all-reduce, so every rank applies the
same optimiser step and the parameters stay identical (rank 0's initialisation is
broadcast before training). Averaging equals the gradient of the mean loss over the
global batch of ``batch_size * world_size`` images: with layer-local losses every
block still receives only the gradient of its own block's loss, summed over ranks.

Nothing here runs when :mod:`torch.distributed` is not initialised.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["average_gradients", "broadcast_modules", "dist_world", "shard", "shared_seed",
           "sum_across_ranks"]


def dist_world() -> tuple[int, int] | None:
    """``(rank, world_size)`` when a default process group exists, else ``None``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def broadcast_modules(*modules: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank, in place."""
    import torch.distributed as dist

    with torch.no_grad():
        for module in modules:
            for t in module.state_dict().values():
                dist.broadcast(t, src=0)


def shared_seed(generator: torch.Generator, device: torch.device) -> int:
    """A 62-bit seed drawn from ``generator`` on rank 0 and broadcast to all ranks."""
    import torch.distributed as dist

    seed = torch.randint(0, 2 ** 62, (1,), generator=generator, dtype=torch.int64)
    seed = seed.to(device)
    dist.broadcast(seed, src=0)
    return int(seed.item())


def shard(perm: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's slice ``perm[rank::world_size]`` of a permutation padded by wrapping.

    Parameters
    ----------
    perm : Tensor of shape (n,)
        The same permutation on every rank.
    rank, world_size : int

    Returns
    -------
    Tensor of shape (ceil(n / world_size),)
        The shards of all ranks cover every index; they have equal lengths, so
        every rank runs the same number of optimiser steps.
    """
    n = perm.shape[0]
    total = -(-n // world_size) * world_size
    if total > n:
        reps = -(-total // n)
        perm = perm.repeat(reps)[:total]
    return perm[rank:total:world_size]


def average_gradients(params: Sequence[torch.Tensor], world_size: int) -> None:
    """Replace every ``p.grad`` by its mean over ranks (one flat all-reduce).

    A missing gradient counts as zeros (and is materialised), so the collective is
    the same on every rank whatever the local graph was.
    """
    import torch.distributed as dist

    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    offset = 0
    for g in grads:
        k = g.numel()
        g.copy_(flat[offset:offset + k].view_as(g))
        offset += k


def sum_across_ranks(t: torch.Tensor) -> torch.Tensor:
    """All-reduce (sum) of a copy of ``t``."""
    import torch.distributed as dist

    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out
