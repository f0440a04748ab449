"""Federations of clients with a hidden cluster structure, for clustered federated learning."""

from __future__ import annotations

import math
from typing import Literal, TypeAlias, get_args

import numpy as np
from sklearn.datasets import load_digits

from mlpapers._utils import (
    RandomStateLike,
    check_in_options,
    check_positive,
    check_random_state,
    float32_within_range,
)

__all__ = ["make_federated_digits", "make_federated_linear"]


def _unit_models(K: int, d: int, separation: float, rng: np.random.RandomState,
                 max_tries: int = 200) -> np.ndarray:
    """K unit vectors in R^d with pairwise distances in [separation, 5 * separation]."""
    d_max = np.sqrt(2.0 * K / (K - 1)) if K > 1 else 2.0  # the regular simplex
    if separation > d_max * (1 + 1e-12):
        raise ValueError(f"separation must be <= sqrt(2K / (K - 1)) = {d_max:.4g} for "
                         f"{K} unit-norm models (a regular simplex), got {separation}.")
    if d == 1:  # the only unit vectors are -1 and +1, at distance 2
        if K > 2 or (K == 2 and not separation <= 2.0 <= 5 * separation):
            raise ValueError(f"n_features=1 holds at most 2 unit-norm models, at distance 2 "
                             f"(separation in [0.4, 2]); got {K} models, separation "
                             f"{separation}. Raise n_features.")
        sign = 1.0 if rng.uniform() < 0.5 else -1.0
        return sign * np.array([[1.0], [-1.0]])[:K]
    # Perturb a common centre c by an angle alpha: two such vectors with (almost)
    # orthogonal perturbations are sqrt(2) sin(alpha) apart; aim at 2 * separation.
    sin_a = min(1.0, np.sqrt(2.0) * separation)
    for _ in range(max_tries):
        c = rng.standard_normal(d)
        c /= np.linalg.norm(c)
        U = rng.standard_normal((K, d))
        U -= np.outer(U @ c, c)
        U /= np.linalg.norm(U, axis=1, keepdims=True)
        if sin_a >= 1.0:
            theta = U if K > 1 else rng.standard_normal((K, d))
        else:
            theta = np.sqrt(1 - sin_a**2) * c + sin_a * U
        theta /= np.linalg.norm(theta, axis=1, keepdims=True)
        if K == 1:
            return theta
        dist = _pairwise_distances(theta)
        if dist.min() >= separation and dist.max() <= 5 * separation:
            return theta
    if 1 < K <= d:
        # large separations (near the simplex bound) are out of reach of random
        # perturbations: a randomly oriented regular simplex of K vertices, shrunk
        # towards its normal c, has all pairwise distances equal to s * d_max
        E = np.linalg.qr(rng.standard_normal((d, K)))[0].T  # K orthonormal rows
        c = E.mean(0)
        V = E - c
        V /= np.linalg.norm(V, axis=1, keepdims=True)
        s = min(d_max, 2.0 * separation) / d_max
        theta = np.sqrt(max(0.0, 1.0 - s**2)) * c / np.linalg.norm(c) + s * V
        theta /= np.linalg.norm(theta, axis=1, keepdims=True)
        # (checked: below float64's resolution of unit vectors, separation 1e-300, the
        # shrunk simplex collapsed to one point, returned as K identical models)
        if _pairwise_within(theta, separation):
            return theta
    polytope = _circle_or_cross_polytope(K, d, separation, rng)
    if polytope is not None:
        return polytope
    advice = ("raise separation (unit vectors closer than about 1e-16 are not distinct in "
              "float64)" if separation < 1e-15 else "lower separation or raise n_features")
    raise ValueError(
        f"could not place {K} unit-norm models in {d} dimensions with pairwise distances in "
        f"[{separation}, {5 * separation}]; {advice}."
    )


def _circle_or_cross_polytope(K: int, d: int, separation: float,
                              rng: np.random.RandomState) -> np.ndarray | None:
    """Layouts for more models than dimensions (K > d >= 2), where perturbing a common
    centre gives too few directions (in 2-D only two): K points spaced by the smallest
    allowed angle on a circle in a random plane, else K vertices ``+-q_i`` of a randomly
    rotated cross-polytope (pairwise distances sqrt(2) and 2). None if neither fits
    ``[separation, 5 * separation]``."""
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0]  # a random orthonormal basis
    if separation <= 2.0:
        step = 2.0 * np.arcsin(separation / 2.0)  # adjacent points exactly separation apart
        # (K = 6 at the documented bound 2 sin(pi / 6) = 1: 6 * 2 arcsin(0.5) rounds one
        # step above 2 pi, and the layout was refused)
        if K * step <= 2.0 * np.pi * (1 + 1e-12):
            phi = rng.uniform(0.0, 2.0 * np.pi) + step * np.arange(K)
            theta = np.outer(np.cos(phi), Q[:, 0]) + np.outer(np.sin(phi), Q[:, 1])
            if _pairwise_within(theta, separation):
                return theta
    if K <= 2 * d:
        theta = np.stack([Q[:, i // 2] * (1.0 if i % 2 == 0 else -1.0) for i in range(K)])
        if _pairwise_within(theta, separation):
            return theta
    return None


def _pairwise_distances(theta: np.ndarray) -> np.ndarray:
    """The distances between all pairs of rows (upper triangle, flattened)."""
    return np.linalg.norm(theta[:, None] - theta[None], axis=2)[np.triu_indices(len(theta), 1)]


def _pairwise_within(theta: np.ndarray, separation: float) -> bool:
    dist = _pairwise_distances(theta)
    # the rows are exactly separation apart by construction (and K = 6 on a circle is
    # 5 separation across): allow the rounding, relative and absolute (unit rows: a few
    # eps per coordinate, which refused most circle layouts at separation 1e-4)
    # (at most half the separation: below float64's resolution, 1e-300, the rows
    # collapse to one point, which must still be refused)
    slack = min(0.5 * separation, separation * 1e-12 + 64 * np.finfo(np.float64).eps)
    return bool(dist.min() >= separation - slack and dist.max() <= 5 * separation + slack)


def make_federated_linear(
    n_clusters: int = 5,
    n_clients_per_cluster: int = 5,
    n_samples: int = 200,
    n_features: int = 20,
    separation: float = 1.0,
    noise: float = 0.01,
    random_state: RandomStateLike = None,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Mixture of linear regressions split across clients (CLoVE's theory setting).

    Cluster :math:`k` has a unit-norm model :math:`\\theta^*_k`, with pairwise
    distances between :math:`\\Delta` (``separation``) and :math:`5\\Delta`. A client
    of cluster :math:`k` holds :math:`x \\sim \\mathcal{N}(0, I_d)` and
    :math:`y = \\langle x, \\theta^*_k \\rangle + \\varepsilon`,
    :math:`\\varepsilon \\sim \\mathcal{N}(0, \\sigma^2)` (no intercept). Clients are
    listed cluster by cluster.

    Parameters
    ----------
    n_clusters : int, default=5
        Number of clusters :math:`K`.
    n_clients_per_cluster : int, default=5
        Clients per cluster.
    n_samples : int, default=200
        Samples per client.
    n_features : int, default=20
        Dimension :math:`d`.
    separation : float, default=1.0
        Minimum pairwise distance :math:`\\Delta` of the true models, at most
        :math:`\\sqrt{2K/(K-1)}` (a regular simplex: 2 for two clusters; values
        near the bound need ``n_features >= n_clusters``). With more clusters than
        features the models are placed on a circle (any separation up to
        :math:`2\\sin(\\pi/K)` for :math:`K \\le 6`) or at the vertices of a
        cross-polytope (pairwise distances :math:`\\sqrt 2` and 2) when random
        placement fails; other layouts raise a ``ValueError``.
    noise : float, default=0.01
        Noise standard deviation :math:`\\sigma`.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the data: an int in ``[0, 2**32)`` or a ``RandomState`` gives
        reproducible data, a ``Generator`` seeds a new ``RandomState`` with one of
        its draws, and ``None`` uses numpy's global ``RandomState`` (as
        :func:`sklearn.utils.check_random_state`).

    Returns
    -------
    clients : list of (X, y)
        ``n_clusters * n_clients_per_cluster`` pairs, ``X`` of shape
        ``(n_samples, n_features)`` and ``y`` of shape ``(n_samples,)``, float32.
    cluster_labels : ndarray of int of shape (n_clients,)
        True cluster of each client.
    coef : ndarray of shape (n_clusters, n_features)
        True models :math:`\\theta^*_k`.

    References
    ----------
    .. [1] Bhatia, Papadis, Kodialam, Lakshman, Chakrabarty, "CLoVE: Personalized
       Federated Learning through Clustering of Loss Vector Embeddings", ICML 2026,
       arXiv:2506.22427.

    Examples
    --------
    >>> from mlpapers.datasets import make_federated_linear
    >>> clients, labels, coef = make_federated_linear(n_clusters=2, random_state=0)
    >>> len(clients), clients[0][0].shape, coef.shape
    (10, (200, 20), (2, 20))
    """
    for name, value in (("n_clusters", n_clusters), ("n_clients_per_cluster",
                        n_clients_per_cluster), ("n_samples", n_samples),
                        ("n_features", n_features)):
        check_positive(value, name, integer=True)
    check_positive(separation, "separation")
    check_positive(noise, "noise", strict=False)
    if separation > 2:
        raise ValueError(f"separation must be <= 2 for unit-norm models, got {separation}.")
    rng = check_random_state(random_state)
    coef = _unit_models(n_clusters, n_features, separation, rng)
    labels = np.repeat(np.arange(n_clusters), n_clients_per_cluster)
    clients = []
    for k in labels:
        X = rng.standard_normal((n_samples, n_features))
        with np.errstate(over="ignore"):
            y = X @ coef[k] + noise * rng.standard_normal(n_samples)
        clients.append((X.astype(np.float32), float32_within_range(y, "noise", noise)))
    return clients, labels, coef


def _transform(images: np.ndarray, k: int) -> np.ndarray:
    """The k-th element of the dihedral group of the square (k < 8) on 8x8 images."""
    out = np.rot90(images, k % 4, axes=(1, 2))
    return out[:, :, ::-1] if k >= 4 else out


def _label_permutations(K: int, n_swaps: int, rng: np.random.RandomState) -> list[np.ndarray]:
    perms: list[np.ndarray] = []
    seen: set[tuple[np.integer, ...]] = set()
    while len(perms) < K:
        perm = np.arange(10)
        if perms:  # cluster 0 keeps the true labels
            pairs = rng.permutation(10)[: 2 * n_swaps].reshape(n_swaps, 2)
            for a, b in pairs:
                perm[a], perm[b] = perm[b], perm[a]
        key = tuple(perm)
        if key not in seen:
            seen.add(key)
            perms.append(perm)
    return perms


#: ``make_federated_digits(kind=...)``; ``FEDERATED_KINDS`` lists its values.
FederatedKind: TypeAlias = Literal["rotation", "label_swap"]
FEDERATED_KINDS: tuple[str, ...] = get_args(FederatedKind)


def make_federated_digits(
    kind: FederatedKind = "rotation",
    n_clusters: int = 4,
    n_clients_per_cluster: int = 5,
    n_samples: int = 80,
    n_swaps: int = 2,
    random_state: RandomStateLike = None,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Scikit-learn's bundled digits split across clients with a hidden cluster shift.

    The 1,797 8x8 digits are shuffled and dealt out to the clients (without
    replacement while they last). Clients of cluster :math:`k` then see

    * ``kind="rotation"`` (feature shift): images rotated by :math:`90k` degrees
      (clusters 4-7 add a mirror flip, so up to 8 clusters);
    * ``kind="label_swap"`` (concept shift): true images whose labels are
      permuted by ``n_swaps`` random transpositions (cluster 0 keeps the true
      labels; every cluster has a different permutation).

    Parameters
    ----------
    kind : {"rotation", "label_swap"}, default="rotation"
        The shift between clusters: rotated (and mirrored) images, or permuted
        labels (see above).
    n_clusters : int, default=4
        Number of clusters (at most 8 for rotations).
    n_clients_per_cluster : int, default=5
        Clients per cluster; clients are listed cluster by cluster.
    n_samples : int, default=80
        Samples per client.
    n_swaps : int, default=2
        Label transpositions per cluster (``label_swap`` only, 1..5). They give
        ``1 + 10! / ((10 - 2 n_swaps)! 2^n_swaps n_swaps!)`` distinct permutations
        (46 for one swap), the largest possible ``n_clusters``.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the data: an int in ``[0, 2**32)`` or a ``RandomState`` gives
        reproducible data, a ``Generator`` seeds a new ``RandomState`` with one of
        its draws, and ``None`` uses numpy's global ``RandomState`` (as
        :func:`sklearn.utils.check_random_state`).

    Returns
    -------
    clients : list of (X, y)
        ``X`` of shape ``(n_samples, 64)`` in [0, 1], float32; ``y`` int64 labels.
    cluster_labels : ndarray of int of shape (n_clients,)
        True cluster of each client (``n_clients = n_clusters *
        n_clients_per_cluster``).

    References
    ----------
    .. [1] Bhatia, Papadis, Kodialam, Lakshman, Chakrabarty, "CLoVE: Personalized
       Federated Learning through Clustering of Loss Vector Embeddings", ICML 2026,
       arXiv:2506.22427.

    Examples
    --------
    >>> from mlpapers.datasets import make_federated_digits
    >>> clients, labels = make_federated_digits("label_swap", n_clusters=2, random_state=0)
    >>> len(clients), clients[0][0].shape
    (10, (80, 64))
    """
    check_in_options(kind, "kind", FEDERATED_KINDS)
    for name, value in (("n_clusters", n_clusters), ("n_clients_per_cluster",
                        n_clients_per_cluster), ("n_samples", n_samples),
                        ("n_swaps", n_swaps)):
        check_positive(value, name, integer=True)
    if kind == "rotation" and n_clusters > 8:
        raise ValueError(f"kind='rotation' supports at most 8 clusters, got {n_clusters}.")
    if n_swaps > 5:  # (checked for either kind, though only label_swap reads it)
        raise ValueError(f"n_swaps must be <= 5 (10 labels), got {n_swaps}.")
    if kind == "label_swap":
        # identity + the sets of n_swaps disjoint transpositions of 10 labels
        n_perms = 1 + math.factorial(10) // (math.factorial(10 - 2 * n_swaps)
                                              * 2**n_swaps * math.factorial(n_swaps))
        if n_clusters > n_perms:
            raise ValueError(f"kind='label_swap' with n_swaps={n_swaps} has only {n_perms} "
                             f"distinct label permutations, got n_clusters={n_clusters}.")
    rng = check_random_state(random_state)
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0
    target = digits.target.astype(np.int64)
    n_clients = n_clusters * n_clients_per_cluster
    total = n_clients * n_samples
    idx = rng.permutation(len(images))
    if total > len(images):
        idx = np.concatenate([idx, rng.choice(len(images), total - len(idx))])
    idx = idx[:total].reshape(n_clients, n_samples)
    labels = np.repeat(np.arange(n_clusters), n_clients_per_cluster)
    perms = _label_permutations(n_clusters, n_swaps, rng) if kind == "label_swap" else []
    clients = []
    for i, k in enumerate(labels):
        imgs, y = images[idx[i]], target[idx[i]]
        if kind == "rotation":
            imgs = _transform(imgs, int(k))
        else:
            y = perms[k][y]
        clients.append((np.ascontiguousarray(imgs.reshape(n_samples, 64)), y))
    return clients, labels
