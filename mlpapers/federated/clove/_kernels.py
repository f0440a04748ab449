"""Pure math of clustered federated learning: batched client updates and model averaging.

Nothing here holds estimator state. The client kernels work on *stacked*
parameters, a dict ``name -> tensor`` whose leading axis indexes models or
clients, and are vectorised with :func:`torch.func.vmap`. The assignment rules
(numpy loss matrices -> model of each client) live in ``_assign`` and are
re-exported here.

Shapes: ``n`` clients, ``K`` models, ``m`` padded samples per client, ``b`` batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from mlpapers._utils._blocks import block_rows_for, collect_row_blocks
from mlpapers.federated.clove._assign import (  # re-exported: importable from here as before
    choose_n_clusters,
    clove_assign,
    ifca_assign,
    match_clusters,
    random_assignment,
)

__all__ = [
    "batched_adam_step",
    "batched_loss_matrix",
    "choose_n_clusters",
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
def batched_loss_matrix(
    loss_fn: Callable[..., torch.Tensor],
    params: Params,
    X: torch.Tensor,
    Y: torch.Tensor,
    mask: torch.Tensor,
    *,
    max_elements: int = 2**25,
    sample_elements: int | None = None,
) -> torch.Tensor:
    """Mean loss of every model on every client, as one vmapped computation.

    Parameters
    ----------
    loss_fn : callable
        ``loss_fn(params, x, y, mask) -> scalar`` for one model and one client:
        ``x`` is ``m x ...``, ``y`` is ``m x ...``, ``mask`` is ``m`` (bool); the
        masked mean loss.
    params : dict of str to Tensor
        Stacked model parameters, each ``K x ...``.
    X : Tensor of shape (n, m, ...)
        Padded client inputs.
    Y : Tensor of shape (n, m, ...)
        Padded client targets.
    mask : bool Tensor of shape (n, m)
        ``True`` on real samples.
    max_elements : int, default=2**25
        Memory bound: clients are processed in chunks with
        ``K * chunk * m * max(4 * features, sample_elements) <= max_elements`` (at
        least one client per chunk).
    sample_elements : int, optional
        Elements of the intermediate tensors of one sample under one model (the
        model's activations, see :func:`~._models.activation_elements`). Default
        ``4 * features``, a margin for the loss's intermediates that a model wider
        than its input exceeds: an MLP of width 512 on 10 features held 13 times
        the bound (3.3 GB for 200 clients of 500 samples and 10 models).

    Returns
    -------
    Tensor of shape (n, K)
    """
    K = next(iter(params.values())).shape[0]
    n, m = mask.shape
    per_sample = 4 * int(np.prod(X.shape[2:], dtype=np.int64))
    if sample_elements is not None:
        per_sample = max(per_sample, int(sample_elements))
    per_client = max(1, K * m * per_sample)
    chunk = block_rows_for(per_client, max_elements, cap=n)
    over_clients = torch.func.vmap(loss_fn, in_dims=(None, 0, 0, 0))
    over_models = torch.func.vmap(over_clients, in_dims=(0, None, None, None))
    with torch.no_grad():
        # each chunk's (chunk, K) losses are copied into one output allocated once: a
        # list of them, each allocated after a chunk's large transients, would pin
        # new heap memory per chunk (see mlpapers._utils._blocks)
        return collect_row_blocks(
            lambda sl: over_models(params, X[sl], Y[sl], mask[sl]).T, n, chunk)


def batched_adam_step(
    params: Params,
    grads: Params,
    exp_avg: Params,
    exp_avg_sq: Params,
    step: torch.Tensor,
    active: torch.Tensor,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """One Adam step on stacked per-client parameters, in place, for active clients.

    Same arithmetic as :class:`torch.optim.Adam` (bias-corrected, ``eps`` added
    after the square root); inactive clients (no batch left this epoch) keep
    their parameters and moments.

    Parameters
    ----------
    params, grads, exp_avg, exp_avg_sq : dict of str to Tensor
        Each ``n x ...``; ``params`` and the moments are updated in place.
    step : Tensor of shape (n,)
        Per-client step counts *after* this step's increment.
    active : bool Tensor of shape (n,)
    """
    b1, b2 = betas
    bc1 = 1 - b1 ** step.clamp_min(1).to(torch.float64)
    bc2 = 1 - b2 ** step.clamp_min(1).to(torch.float64)
    for name, p in params.items():
        g = grads[name]
        shape = (-1,) + (1,) * (p.ndim - 1)
        act = active.view(shape)
        m = exp_avg[name]
        v = exp_avg_sq[name]
        m.copy_(torch.where(act, b1 * m + (1 - b1) * g, m))
        v.copy_(torch.where(act, b2 * v + (1 - b2) * g * g, v))
        step_size = (lr / bc1).to(p.dtype).view(shape)
        denom = (v.sqrt() / bc2.sqrt().to(p.dtype).view(shape)) + eps
        p.copy_(torch.where(act, p - step_size * m / denom, p))


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


def n_steps_per_epoch(sizes: torch.Tensor, batch_size: int) -> int:
    """Number of mini-batch steps of the largest client in one epoch."""
    return int(math.ceil(int(sizes.max()) / batch_size))


def epoch_permutations(
    sizes: torch.Tensor, m: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Independent random orders of each client's samples, padding last.

    Parameters
    ----------
    sizes : long Tensor of shape (n,)
        Number of real samples of each client.
    m : int
        Padded length.

    Returns
    -------
    long Tensor of shape (n, m)
        Row ``i`` starts with a random permutation of ``0 .. sizes[i] - 1``.
    """
    n = sizes.shape[0]
    keys = torch.rand(n, m, generator=generator, dtype=torch.float32).to(device)
    pad = torch.arange(m, device=device)[None, :] >= sizes.to(device)[:, None]
    keys = keys.masked_fill(pad, 2.0)
    return keys.argsort(dim=1, stable=True)
