"""Assignment rules of clustered federated learning (pure numpy, no estimator state).

Every rule takes a loss matrix ``L`` of shape ``(n_clients, n_models)`` (``L[i, j]``
is the mean loss of model ``j`` on client ``i``'s data) and returns the model of
each client, so a Flower strategy or any other driver can reuse them: CLoVE's
k-means on loss vectors with Hungarian matching (:func:`clove_assign`), IFCA's
argmin (:func:`ifca_assign`), the unknown-K choice (:func:`choose_n_clusters`)
and the random initial assignment.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias, overload

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import AgglomerativeClustering, KMeans
from sklearn.metrics import silhouette_score

from mlpapers._utils import ArrayLike, check_bool, check_positive, check_real, on_inputs_device

__all__ = [
    "choose_n_clusters",
    "clove_assign",
    "ifca_assign",
    "match_clusters",
    "random_assignment",
]


def _check_loss_matrix(loss_matrix) -> np.ndarray:
    if isinstance(loss_matrix, torch.Tensor):
        loss_matrix = loss_matrix.detach().cpu().numpy()
    check_real(loss_matrix, "loss_matrix")
    L = np.asarray(loss_matrix, dtype=np.float64)
    if L.ndim != 2:
        raise ValueError(f"loss_matrix must be 2D (n_clients, n_models), got {L.ndim}D.")
    if L.shape[0] < 1 or L.shape[1] < 1:
        raise ValueError(f"loss_matrix must be non-empty, got shape {L.shape}.")
    if not np.isfinite(L).all():
        raise ValueError("loss_matrix contains NaN or infinity.")
    return L


def _unit_scale(L: np.ndarray) -> tuple[np.ndarray, int]:
    """``(L * 2**-e, e)`` with ``2**e`` the power of two just above ``max |L|``.

    k-means, Ward linkage, the silhouette and the matching are scale-equivariant, but
    their squared distances and sums underflow or overflow for losses far from 1
    (below ~1e-160 or above ~1e154): clients then collapse into one cluster or the
    linkage fails. Scaling by a power of two is exact, so well-scaled inputs give
    bit-identical results.
    """
    top = float(np.abs(L).max())
    if top == 0.0:
        return L, 0
    e = math.frexp(top)[1]
    return np.ldexp(L, -e), e


def match_clusters(loss_matrix, cluster_labels, n_clusters: int) -> np.ndarray:
    """Match clusters to models with the Hungarian algorithm on summed losses.

    The cost of giving model ``j`` to cluster ``c`` is
    :math:`C_{cj} = \\sum_{i:\\,c_i = c} L_{ij}`; the matching minimises the total cost
    :math:`\\sum_c C_{c\\pi(c)}` over injective maps :math:`\\pi` (rectangular when
    there are fewer clusters than models).

    Parameters
    ----------
    loss_matrix : array-like of shape (n_clients, n_models)
        ``L[i, j]`` is the mean loss of model ``j`` on client ``i``'s data.
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
    np.add.at(cost, labels, _unit_scale(L)[0])  # sums of huge losses would overflow
    rows, cols = linear_sum_assignment(cost)
    perm = np.empty(n_clusters, dtype=np.int64)
    perm[rows] = cols
    return perm


def _canonical_row_order(*keys: np.ndarray) -> np.ndarray:
    """Row order sorting by the columns of ``keys[0]``, then of ``keys[1]``, ...: rows
    equal in every key are interchangeable, so any client order gives the same rows."""
    return np.lexsort(np.vstack([K.T[::-1] for K in reversed(keys)]))



#: seeds of scikit-learn's KMeans (``check_random_state``: a numpy Generator is refused)
SklearnSeed: TypeAlias = int | np.integer | np.random.RandomState | None


@overload
def clove_assign(loss_matrix: ArrayLike, n_clusters: int | None = None,
                 random_state: SklearnSeed = None, *, n_init: int = 10,
                 return_centers: Literal[False] = False, match_losses: ArrayLike | None = None
                 ) -> np.ndarray: ...
@overload
def clove_assign(loss_matrix: ArrayLike, n_clusters: int | None = None,
                 random_state: SklearnSeed = None, *, n_init: int = 10,
                 return_centers: Literal[True], match_losses: ArrayLike | None = None
                 ) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def clove_assign(loss_matrix: ArrayLike, n_clusters: int | None = None,
                 random_state: SklearnSeed = None, *, n_init: int = 10,
                 return_centers: bool = False, match_losses: ArrayLike | None = None
                 ) -> np.ndarray | tuple[np.ndarray, np.ndarray]: ...
@on_inputs_device
def clove_assign(
    loss_matrix: ArrayLike,
    n_clusters: int | None = None,
    random_state: SklearnSeed = None,
    *,
    n_init: int = 10,
    return_centers: bool = False,
    match_losses: ArrayLike | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """CLoVE's assignment step: k-means on loss vectors, then Hungarian matching.

    Each row of ``loss_matrix`` is a client's loss vector (its loss under every
    model). The rows are clustered by k-means into ``n_clusters`` groups, and
    the groups are matched to models by ``match_clusters()`` (minimum total
    loss), which removes the label switching of k-means between rounds.

    The rows are sorted lexicographically before k-means and the labels mapped
    back, so the result does not depend on the order of the clients; identical
    rows always share a model. When the matrix has fewer distinct rows than
    ``n_clusters``, k-means runs with that smaller number (some models then get
    no client); a cluster k-means leaves empty (rows closer than it can resolve
    next to far larger differences) is dropped the same way.

    The losses are rescaled by a power of two first (exact), so their unit or
    magnitude does not change the result.

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
    match_losses : array-like of shape (n_clients, n_models), optional
        Losses the clusters are matched on (default ``loss_matrix``): with a
        transformed embedding (e.g. square roots) pass the raw losses, so that the
        match still minimises the total loss.

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
    check_bool(return_centers, "return_centers")
    L = _check_loss_matrix(loss_matrix)
    n, n_models = L.shape
    if n_clusters is not None:
        check_positive(n_clusters, "n_clusters", integer=True)
    k = n_models if n_clusters is None else int(n_clusters)
    if not 1 <= k <= n_models:
        raise ValueError(f"n_clusters must be in [1, {n_models}], got {n_clusters}.")
    if k > n:
        raise ValueError(f"n_clusters={k} exceeds the number of clients {n}.")
    check_positive(n_init, "n_init", integer=True)  # (True passed as 1 to KMeans)
    if isinstance(random_state, (bool, np.bool_)):  # (KMeans seeds with True as 1)
        raise TypeError(f"random_state must be None, an int or a numpy RandomState, got "
                        f"{random_state!r}.")
    M = L if match_losses is None else _check_loss_matrix(match_losses)
    if M.shape != L.shape:
        raise ValueError(f"match_losses must have the shape of loss_matrix {L.shape}, "
                         f"got {M.shape}.")
    # a canonical row order (by L, then by M): k-means and the summed matching costs see
    # the same rows in the same order whatever the clients' order, so that float rounding
    # cannot break a tie of summed losses differently for a permuted input
    order = _canonical_row_order(L, M)
    L, scale = _unit_scale(L)
    Ls = L[order]
    distinct = 1 + int(np.any(np.diff(Ls, axis=0) != 0, axis=1).sum()) if n > 1 else 1
    k_eff = min(k, distinct)
    if k_eff == 1:
        labels_sorted = np.zeros(n, dtype=np.int64)
        centers_c = Ls.mean(axis=0, keepdims=True)
    else:
        km = KMeans(n_clusters=k_eff, n_init=n_init, random_state=random_state).fit(Ls)
        # k-means can leave a cluster empty when rows differ by many orders of magnitude
        # less than others (it then warns): keep the clusters that hold clients only
        used, labels_sorted = np.unique(km.labels_, return_inverse=True)
        labels_sorted = labels_sorted.astype(np.int64).reshape(-1)
        centers_c = km.cluster_centers_[used]
        k_eff = len(used)
    labels = np.empty(n, dtype=np.int64)
    labels[order] = labels_sorted
    perm = match_clusters(M[order], labels_sorted, k_eff)
    assignment = perm[labels]
    if not return_centers:
        return assignment
    centers = np.full((n_models, n_models), np.nan)
    centers[perm] = np.ldexp(centers_c, scale)
    return assignment, centers


@on_inputs_device
def ifca_assign(loss_matrix: ArrayLike) -> np.ndarray:
    """IFCA's assignment: each client takes its lowest-loss model (ties: lowest index).

    Parameters
    ----------
    loss_matrix : array-like of shape (n_clients, n_models)
        ``L[i, j]`` is the mean loss of model ``j`` on client ``i``'s data (finite,
        else ``ValueError``; numpy, torch tensor or nested lists).

    Returns
    -------
    assignment : ndarray of int of shape (n_clients,)
        ``argmin_j L[i, j]``, the model of each client.

    References
    ----------
    .. [1] Ghosh, Chung, Yin, Ramchandran, "An Efficient Framework for Clustered
       Federated Learning", NeurIPS 2020, arXiv:2006.04088.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.federated import ifca_assign
    >>> ifca_assign(np.array([[0.1, 2.0], [3.0, 0.1], [1.0, 1.0]])).tolist()
    [0, 1, 0]
    """
    return _check_loss_matrix(loss_matrix).argmin(axis=1).astype(np.int64)


@on_inputs_device
def choose_n_clusters(
    loss_matrix: ArrayLike, max_clusters: int, *, min_gain: float = 0.1
) -> int:
    """Pick the number of clusters of the loss vectors by Ward linkage + silhouette.

    Candidates ``k = 2 .. min(max_clusters, n_distinct, n_clients - 1)`` (the
    silhouette needs ``k < n_clients``; identical loss vectors always share a
    cluster, so ``n_distinct`` rows give at most ``n_distinct`` clusters) are
    scanned in increasing order; a larger ``k`` replaces the current choice only when its
    silhouette beats the current one by more than ``min_gain`` (relative), which
    guards against over-splitting (CLoVE's unknown-K mode). The answer does not
    depend on the order of the clients (the rows are sorted first).

    Parameters
    ----------
    loss_matrix : array-like of shape (n_clients, n_models)
        ``L[i, j]`` is the mean loss of model ``j`` on client ``i``'s data (finite,
        else ``ValueError``; numpy, torch tensor or nested lists).
    max_clusters : int
        Upper bound on the number of clusters.
    min_gain : float, default=0.1
        Relative silhouette improvement a larger ``k`` must achieve, ``>= 0``.

    Returns
    -------
    int
        The chosen number of clusters (1 when all rows are identical; the number
        of distinct rows, at most ``max_clusters``, when no ``k >= 2`` can be scored).

    References
    ----------
    .. [1] Bhatia, Papadis, Kodialam, Lakshman, Chakrabarty, "CLoVE: Personalized
       Federated Learning through Clustering of Loss Vector Embeddings", ICML 2026,
       arXiv:2506.22427.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.federated import choose_n_clusters
    >>> L = np.array([[0.1, 2.0, 2.0], [0.2, 2.1, 2.0], [3.0, 0.1, 2.0],
    ...               [2.9, 0.2, 2.1], [2.0, 2.0, 0.1], [2.1, 2.0, 0.2]])
    >>> choose_n_clusters(L, max_clusters=3)
    3
    """
    L = _check_loss_matrix(loss_matrix)
    check_positive(max_clusters, "max_clusters", integer=True)
    check_positive(min_gain, "min_gain", strict=False)  # (NaN or -1 passed silently)
    # a canonical row order: Ward linkage breaks ties of merge costs by position, so the
    # clients' order could otherwise change the chosen number (as in clove_assign)
    L = _unit_scale(L[_canonical_row_order(L)])[0]
    distinct = np.unique(L, axis=0).shape[0]
    # k = distinct is a valid candidate when rows repeat (it is < n_clients then)
    hi = min(int(max_clusters), distinct, L.shape[0] - 1)
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
        Source of the permutation and of the extra clients' models.

    Returns
    -------
    assignment : ndarray of int of shape (n_clients,)
    """
    if n_clients < n_models:
        raise ValueError(f"need n_clients >= n_models, got {n_clients} < {n_models}.")
    a = np.concatenate([np.arange(n_models), rng.integers(0, n_models, n_clients - n_models)])
    return rng.permutation(a).astype(np.int64)
