"""Pure math of clustered federated learning: batched client updates and model averaging.

Nothing here holds estimator state. The client kernels work on *stacked*
parameters, a dict ``name -> tensor`` whose leading axis indexes models or
clients, and are vectorised with :func:`torch.func.vmap`. The assignment rules
(numpy loss matrices -> model of each client) live in ``_assign`` and are
re-exported here.

Shapes: ``n`` clients, ``K`` models, ``N`` samples of all clients (stored back to
back), ``m`` samples of the largest client, ``b`` batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import torch

from mlpapers._utils._blocks import block_rows_for, row_blocks
from mlpapers.federated.clove._assign import (  # re-exported: importable from here as before
    choose_n_clusters,
    clove_assign,
    ifca_assign,
    match_clusters,
    random_assignment,
)

__all__ = [
    "batch_pieces",
    "batched_adam_step",
    "batched_loss_matrix",
    "choose_n_clusters",
    "client_mean_losses",
    "clove_assign",
    "ifca_assign",
    "match_clusters",
    "random_assignment",
    "weighted_model_average",
]

Params = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------
# batched client kernels (torch)
# ---------------------------------------------------------------------------
def client_mean_losses(
    sample_losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    X: torch.Tensor,
    Y: torch.Tensor,
    sizes: torch.Tensor,
    *,
    block_rows: int,
    whole_clients: bool = False,
) -> torch.Tensor:
    """Mean per-sample loss of every client, over blocks of rows of all clients.

    Parameters
    ----------
    sample_losses : callable
        ``sample_losses(x, y)`` returns the losses of the rows ``x`` (targets ``y``),
        shape ``(..., rows)``: one loss per row, for one model or for a leading axis
        of models.
    X, Y : Tensor of shape (N, ...)
        The clients' rows back to back (:class:`~._engine.ClientData`).
    sizes : long Tensor of shape (n,)
        Rows of each client, in order (all positive).
    block_rows : int
        Rows per call of ``sample_losses``: blocks cross client boundaries, so one
        large client costs no more memory than many small ones.
    whole_clients : bool, default=False
        One call per client on all its rows instead (``block_rows`` unused), for a
        model whose output rows do not match its input rows: a reconstruction
        returned flat or transposed, which is compared with its input by size only.

    Returns
    -------
    Tensor of shape (..., n)
        The per-client means, in the losses' dtype, summed in float64 (a float32 sum
        of many finite losses could overflow where their mean does not).
    """
    offsets = torch.cumsum(sizes, 0)
    sums: torch.Tensor | None = None
    dtype: torch.dtype | None = None
    blocks = (slice(int(a), int(b)) for a, b in zip(offsets - sizes, offsets)) \
        if whole_clients else row_blocks(int(offsets[-1]), block_rows)
    for rows in blocks:
        losses = sample_losses(X[rows], Y[rows])
        if sums is None:  # (allocated once, before the loop keeps anything else)
            dtype = losses.dtype
            sums = losses.new_zeros((*losses.shape[:-1], sizes.shape[0]),
                                    dtype=torch.float64)
        owner = torch.searchsorted(offsets, torch.arange(
            rows.start, rows.stop, device=offsets.device), right=True)
        sums.index_add_(-1, owner, losses.to(torch.float64))
    assert sums is not None and dtype is not None  # (N >= 1: no client is empty)
    return (sums / sizes.to(torch.float64)).to(dtype)


def batched_loss_matrix(
    sample_loss_fn: Callable[..., torch.Tensor],
    params: Params,
    X: torch.Tensor,
    Y: torch.Tensor,
    sizes: torch.Tensor,
    *,
    max_elements: int = 2**25,
    sample_elements: int | None = None,
    whole_clients: bool = False,
) -> torch.Tensor:
    """Mean loss of every model on every client, vmapped over the models.

    Parameters
    ----------
    sample_loss_fn : callable
        ``sample_loss_fn(params, x, y) -> (rows,)``: the per-sample losses of one
        model on a block of rows.
    params : dict of str to Tensor
        Stacked model parameters, each ``K x ...``.
    X, Y : Tensor of shape (N, ...)
        The clients' inputs and targets, back to back.
    sizes : long Tensor of shape (n,)
        Samples of each client.
    max_elements : int, default=2**25
        Memory bound: rows are processed in blocks of
        ``K * rows * max(4 * features, sample_elements) <= max_elements`` (at least
        one row), whatever the clients' sizes.
    sample_elements : int, optional
        Elements of the intermediate tensors of one sample under one model (the
        model's activations, see :func:`~._models.activation_elements`). Default
        ``4 * features``, a margin for the loss's intermediates that a model wider
        than its input exceeds: an MLP of width 512 on 10 features held 13 times
        the bound when blocks were sized by the input alone.
    whole_clients : bool, default=False
        One block per client (see :func:`client_mean_losses`).

    Returns
    -------
    Tensor of shape (n, K)
    """
    K = next(iter(params.values())).shape[0]
    per_sample = 4 * int(np.prod(X.shape[1:], dtype=np.int64))
    if sample_elements is not None:
        per_sample = max(per_sample, int(sample_elements))
    over_models = torch.func.vmap(sample_loss_fn, in_dims=(0, None, None))
    with torch.no_grad():
        return client_mean_losses(
            lambda x, y: over_models(params, x, y), X, Y, sizes,
            block_rows=block_rows_for(K * per_sample, max_elements, cap=X.shape[0]),
            whole_clients=whole_clients).T


def batched_adam_step(
    params: Params,
    grads: Params,
    exp_avg: Params,
    exp_avg_sq: Params,
    step: torch.Tensor,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """One Adam step on stacked per-client parameters, in place.

    Same arithmetic as :class:`torch.optim.Adam` (bias-corrected, ``eps`` added
    after the square root). Every client given takes a step: the engine passes
    only the clients that have a batch left this epoch (gathered, then scattered
    back), so the others keep their parameters and moments.

    Parameters
    ----------
    params, grads, exp_avg, exp_avg_sq : dict of str to Tensor
        Each ``n x ...``; ``params`` and the moments are updated in place.
    step : Tensor of shape (n,)
        Per-client step counts *after* this step's increment.
    """
    b1, b2 = betas
    bc1 = 1 - b1 ** step.clamp_min(1).to(torch.float64)
    bc2 = 1 - b2 ** step.clamp_min(1).to(torch.float64)
    for name, p in params.items():
        g = grads[name]
        shape = (-1,) + (1,) * (p.ndim - 1)
        m = exp_avg[name]
        v = exp_avg_sq[name]
        m.copy_(b1 * m + (1 - b1) * g)
        v.copy_(b2 * v + (1 - b2) * g * g)
        step_size = (lr / bc1).to(p.dtype).view(shape)
        denom = (v.sqrt() / bc2.sqrt().to(p.dtype).view(shape)) + eps
        p.copy_(p - step_size * m / denom)


def weighted_model_average(
    client_params: Params,
    assignment: torch.Tensor,
    weights: torch.Tensor,
    old_params: Params,
) -> Params:
    """Per-model weighted average of client parameters (FedAvg inside each cluster).

    :math:`\\theta_j = \\sum_{i: a_i = j} w_i \\theta'_i / \\sum_{i: a_i = j} w_i`; a model
    with no client, or only clients of weight 0, keeps ``old_params``.

    Parameters
    ----------
    client_params : dict of str to Tensor
        Each ``n x ...``.
    assignment : long Tensor of shape (n,)
        Model index of each client.
    weights : Tensor of shape (n,)
        Non-negative client weights (data sizes).
    old_params : dict of str to Tensor
        Each ``K x ...``.

    Returns
    -------
    dict of str to Tensor, each ``K x ...``
    """
    K = next(iter(old_params.values())).shape[0]
    W = torch.zeros(K, assignment.shape[0], dtype=torch.float64, device=assignment.device)
    W[assignment, torch.arange(assignment.shape[0], device=assignment.device)] = (
        weights.to(torch.float64)
    )
    tot = W.sum(1)
    has = tot > 0
    W = W / tot.clamp_min(1e-300)[:, None]
    out = {}
    for name, old in old_params.items():
        cp = client_params[name]
        if not cp.is_floating_point():  # integer buffers (counters): keep the max
            new = old.clone()
            for j in torch.nonzero(has).flatten().tolist():
                new[j] = cp[assignment == j].max(0).values
            out[name] = new
            continue
        avg = torch.einsum("kn,n...->k...", W.to(cp.dtype), cp)
        shape = (-1,) + (1,) * (old.ndim - 1)
        out[name] = torch.where(has.view(shape), avg, old)
    return out


def batch_pieces(sizes: torch.Tensor, lo: int, hi: int, budget: int
                 ) -> Iterator[tuple[torch.Tensor | None, int, int]]:
    """Pieces of one training step's batch slots ``[lo, hi)`` of clients of ``sizes``
    that hold at most ``budget`` rows (client x slot) each, where possible.

    Yields ``(clients, c0, c1)``: the positions in ``sizes`` of the clients that have
    samples in slot ``c0`` (``None`` for all of them, when the whole batch is one
    piece) and the slots ``[c0, c1)``. A piece is as wide as the budget allows, but
    ends earlier, where one of its clients runs out of samples, if more than half of
    its slots would otherwise lie past its clients' ends (filler slots, computed and
    masked out): the next piece leaves the finished clients out. A piece is one slot
    wide at least, and holds one client at least.
    """
    if sizes.shape[0] * (hi - lo) <= budget:
        yield None, lo, hi
        return
    c0 = lo
    while c0 < hi:
        left = torch.nonzero(sizes > c0).flatten()
        if left.shape[0] == 0:
            return
        group = min(left.shape[0], budget)
        widest = min(hi, c0 + max(1, budget // group))
        # real slots of a piece ending at e: sum over its clients of min(size, e) - c0
        ends = sizes[left].clamp(max=widest).sort().values
        below = torch.cumsum(ends, 0)
        cand = torch.unique(ends)  # (sorted; the last is widest or the longest client)
        n_below = torch.searchsorted(ends, cand)  # clients ending before each candidate
        real = torch.where(n_below > 0, below[(n_below - 1).clamp(min=0)], 0) \
            + (left.shape[0] - n_below) * cand - left.shape[0] * c0
        c1 = int(cand[2 * real >= left.shape[0] * (cand - c0)].max())
        for g0 in range(0, left.shape[0], group):
            yield left[g0:g0 + group], c0, c1
        c0 = c1


def n_steps_per_epoch(sizes: torch.Tensor, batch_size: int) -> int:
    """Number of mini-batch steps of the largest client in one epoch."""
    return int(math.ceil(int(sizes.max()) / batch_size))


def epoch_permutations(
    sizes: torch.Tensor, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Independent random orders of each client's samples, back to back.

    The order of client ``i`` sorts uniform keys drawn for ``m = max(sizes)`` slots of
    which its first ``sizes[i]`` count, so the orders are those of one ``(n, m)`` draw,
    but the keys are drawn for blocks of clients at a time (the same stream of random
    numbers): memory follows the clients' total size, not ``n x`` the largest one.

    Parameters
    ----------
    sizes : long Tensor of shape (n,)
        Number of samples of each client.

    Returns
    -------
    long Tensor of shape (sum(sizes),)
        Entries ``offsets[i] .. offsets[i] + sizes[i] - 1`` (``offsets`` the
        cumulative sizes before client ``i``) are a permutation of
        ``0 .. sizes[i] - 1``.
    """
    sizes = sizes.cpu()
    n, m = sizes.shape[0], int(sizes.max())
    out = torch.empty(int(sizes.sum()), dtype=torch.long)
    start = 0
    for clients in row_blocks(n, block_rows_for(m, 2**20, cap=n)):
        keys = torch.rand(clients.stop - clients.start, m, generator=generator,
                          dtype=torch.float32)
        real = torch.arange(m)[None, :] < sizes[clients, None]
        order = keys.masked_fill(~real, 2.0).argsort(dim=1, stable=True)
        taken = order[real]  # row by row: each client's first sizes[i] slots
        out[start:start + taken.shape[0]] = taken
        start += taken.shape[0]
    return out.to(device)
