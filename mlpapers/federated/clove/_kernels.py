"""Pure math of clustered federated learning: assignment rules and batched client updates.

Nothing here holds estimator state. The assignment rules work on numpy loss
matrices (so a Flower strategy or any other driver can reuse them); the client
kernels work on *stacked* parameters, a dict ``name -> tensor`` whose leading
axis indexes models or clients, and are vectorised with :func:`torch.func.vmap`.

Shapes: ``n`` clients, ``K`` models, ``m`` padded samples per client, ``b`` batch size.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.metrics import silhouette_score

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
# assignment rules (numpy)
# ---------------------------------------------------------------------------
def _check_loss_matrix(loss_matrix) -> np.ndarray:
    if isinstance(loss_matrix, torch.Tensor):
        loss_matrix = loss_matrix.detach().cpu().double().numpy()
    L = np.asarray(loss_matrix, dtype=np.float64)
    if L.ndim != 2:
        raise ValueError(f"loss_matrix must be 2D (n_clients, n_models), got {L.ndim}D.")
    if L.shape[0] < 1 or L.shape[1] < 1:
        raise ValueError(f"loss_matrix must be non-empty, got shape {L.shape}.")
    if not np.isfinite(L).all():
        raise ValueError("loss_matrix contains NaN or infinity.")
    return L


def match_clusters(loss_matrix, cluster_labels, n_clusters: int) -> np.ndarray:
    """Match clusters to models with the Hungarian algorithm on summed losses.

    The cost of giving model ``j`` to cluster ``c`` is
    :math:`C_{cj} = \\sum_{i:\\,c_i = c} L_{ij}`; the matching minimises the total cost
    :math:`\\sum_c C_{c\\pi(c)}` over injective maps :math:`\\pi` (rectangular when
    there are fewer clusters than models).

    Parameters
    ----------
    loss_matrix : array-like of shape (n_clients, n_models)
    cluster_labels : array-like of int of shape (n_clients,)
        Cluster ids in ``[0, n_clusters)``.
    n_clusters : int
        Number of clusters (``<= n_models``).

    Returns
    -------
    perm : ndarray of int of shape (n_clusters,)
        ``perm[c]`` is the model given to cluster ``c``.
    """
    L = _check_loss_matrix(loss_matrix)
    labels = np.asarray(cluster_labels, dtype=np.int64)
    if n_clusters > L.shape[1]:
        raise ValueError(f"n_clusters={n_clusters} exceeds the number of models {L.shape[1]}.")
    cost = np.zeros((n_clusters, L.shape[1]))
    np.add.at(cost, labels, L)
    rows, cols = linear_sum_assignment(cost)
    perm = np.empty(n_clusters, dtype=np.int64)
    perm[rows] = cols
    return perm


def clove_assign(
    loss_matrix,
    n_clusters: int | None = None,
    random_state=None,
    *,
    n_init: int = 10,
    return_centers: bool = False,
):
    """CLoVE's assignment step: k-means on loss vectors, then Hungarian matching.

    Each row of ``loss_matrix`` is a client's loss vector (its loss under every
    model). The rows are clustered by k-means into ``n_clusters`` groups, and
    the groups are matched to models by :func:`match_clusters` (minimum total
    loss), which removes the label switching of k-means between rounds.

    The rows are sorted lexicographically before k-means and the labels mapped
    back, so the result does not depend on the order of the clients; identical
    rows always share a model. When the matrix has fewer distinct rows than
    ``n_clusters``, k-means runs with that smaller number (some models then get
    no client).

    Parameters
    ----------
    loss_matrix : array-like of shape (n_clients, n_models)
        ``L[i, j]`` is the mean loss of model ``j`` on client ``i``'s data.
    n_clusters : int, optional
        Number of clusters, ``1 <= n_clusters <= n_models`` (default ``n_models``).
    random_state : int, RandomState instance or None
        Seed of k-means.
    n_init : int, default=10
        Number of k-means restarts.
    return_centers : bool, default=False
        Also return the k-means centroids indexed by model (rows of models that
        received no cluster are NaN).

    Returns
    -------
    assignment : ndarray of int of shape (n_clients,)
        The model of each client.
    centers : ndarray of shape (n_models, n_models)
        Only with ``return_centers=True``.

    References
    ----------
    .. [1] Bhatia, Papadis, Kodialam, Lakshman, Chakrabarty, "CLoVE: Personalized
       Federated Learning through Clustering of Loss Vector Embeddings", ICML 2026,
       arXiv:2506.22427.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.federated.clove import clove_assign
    >>> L = np.array([[0.1, 2.0], [0.2, 2.1], [3.0, 0.1], [2.9, 0.2]])
    >>> clove_assign(L, 2, random_state=0).tolist()
    [0, 0, 1, 1]
    """
    L = _check_loss_matrix(loss_matrix)
    n, n_models = L.shape
    if n_clusters is not None and (isinstance(n_clusters, bool)
                                   or not isinstance(n_clusters, numbers.Integral)):
        raise TypeError(f"n_clusters must be None or an integer, got {n_clusters!r}.")
    k = n_models if n_clusters is None else int(n_clusters)
    if not 1 <= k <= n_models:
        raise ValueError(f"n_clusters must be in [1, {n_models}], got {n_clusters}.")
    if k > n:
        raise ValueError(f"n_clusters={k} exceeds the number of clients {n}.")
    order = np.lexsort(L.T[::-1])
    Ls = L[order]
    distinct = 1 + int(np.any(np.diff(Ls, axis=0) != 0, axis=1).sum()) if n > 1 else 1
    k_eff = min(k, distinct)
    if k_eff == 1:
        labels_sorted = np.zeros(n, dtype=np.int64)
        centers_c = Ls.mean(axis=0, keepdims=True)
    else:
        km = KMeans(n_clusters=k_eff, n_init=n_init, random_state=random_state).fit(Ls)
        labels_sorted = km.labels_.astype(np.int64)
        centers_c = km.cluster_centers_
    labels = np.empty(n, dtype=np.int64)
    labels[order] = labels_sorted
    perm = match_clusters(L, labels, k_eff)
    assignment = perm[labels]
    if not return_centers:
        return assignment
    centers = np.full((n_models, n_models), np.nan)
    centers[perm] = centers_c
    return assignment, centers


def ifca_assign(loss_matrix) -> np.ndarray:
    """IFCA's assignment: each client takes its lowest-loss model (ties: lowest index).

    Parameters
    ----------
    loss_matrix : array-like of shape (n_clients, n_models)

    Returns
    -------
    assignment : ndarray of int of shape (n_clients,)

    References
    ----------
    .. [1] Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered
       Federated Learning", NeurIPS 2020, arXiv:2006.04088.
    """
    return _check_loss_matrix(loss_matrix).argmin(axis=1).astype(np.int64)


def choose_n_clusters(
    loss_matrix, max_clusters: int, *, min_gain: float = 0.1
) -> int:
    """Pick the number of clusters of the loss vectors by Ward linkage + silhouette.

    Candidates ``k = 2 .. min(max_clusters, n_distinct - 1)`` are scanned in
    increasing order; a larger ``k`` replaces the current choice only when its
    silhouette beats the current one by more than ``min_gain`` (relative), which
    guards against over-splitting (CLoVE's unknown-K mode).

    Parameters
    ----------
    loss_matrix : array-like of shape (n_clients, n_models)
    max_clusters : int
        Upper bound on the number of clusters.
    min_gain : float, default=0.1
        Relative silhouette improvement a larger ``k`` must achieve.

    Returns
    -------
    int
        The chosen number of clusters (1 when fewer than 3 distinct rows exist).
    """
    L = _check_loss_matrix(loss_matrix)
    if isinstance(max_clusters, bool) or not isinstance(max_clusters, numbers.Integral):
        raise TypeError(f"max_clusters must be an integer, got {max_clusters!r}.")
    if max_clusters < 1:
        raise ValueError(f"max_clusters must be >= 1, got {max_clusters}.")
    distinct = np.unique(L, axis=0).shape[0]
    hi = min(int(max_clusters), distinct - 1, L.shape[0] - 1)
    if hi < 2:
        return max(1, min(distinct, int(max_clusters)))
    best_k, best = 2, -np.inf
    for k in range(2, hi + 1):
        labels = AgglomerativeClustering(n_clusters=k, linkage="ward").fit_predict(L)
        score = silhouette_score(L, labels)
        if k == 2 or score > best + min_gain * abs(best):
            best_k, best = k, score
    return best_k


def random_assignment(n_clients: int, n_models: int, rng: np.random.Generator) -> np.ndarray:
    """Random assignment that gives every model at least one client.

    Parameters
    ----------
    n_clients, n_models : int
        ``n_clients >= n_models``.
    rng : numpy.random.Generator

    Returns
    -------
    assignment : ndarray of int of shape (n_clients,)
    """
    if n_clients < n_models:
        raise ValueError(f"need n_clients >= n_models, got {n_clients} < {n_models}.")
    a = np.concatenate([np.arange(n_models), rng.integers(0, n_models, n_clients - n_models)])
    return rng.permutation(a).astype(np.int64)


def _brute_force_matching_cost(cost: np.ndarray) -> float:
    """Minimum of ``sum_c cost[c, pi(c)]`` over injective ``pi`` (tests only, small K)."""
    k, m = cost.shape
    return min(
        float(cost[np.arange(k), list(p)].sum()) for p in itertools.permutations(range(m), k)
    )


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
        Bound on ``K * chunk * m * features``: clients are processed in chunks.

    Returns
    -------
    Tensor of shape (n, K)
    """
    K = next(iter(params.values())).shape[0]
    n, m = mask.shape
    per_client = max(1, K * m * int(np.prod(X.shape[2:], dtype=np.int64)) * 4)
    chunk = max(1, min(n, max_elements // per_client))
    over_clients = torch.func.vmap(loss_fn, in_dims=(None, 0, 0, 0))
    over_models = torch.func.vmap(over_clients, in_dims=(0, None, None, None))
    out = []
    with torch.no_grad():
        for start in range(0, n, chunk):
            sl = slice(start, start + chunk)
            out.append(over_models(params, X[sl], Y[sl], mask[sl]).T)
    return torch.cat(out, 0)


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
    with no client keeps ``old_params``.

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
    keys = torch.rand(n, m, generator=generator).to(device)
    pad = torch.arange(m, device=device)[None, :] >= sizes.to(device)[:, None]
    keys = keys.masked_fill(pad, 2.0)
    return keys.argsort(dim=1, stable=True)
