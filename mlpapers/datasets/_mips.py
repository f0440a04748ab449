"""Synthetic maximum inner product search (MIPS) problems."""

from __future__ import annotations

import numpy as np
import torch

from mlpapers._utils import (
    RandomStateLike,
    check_bool,
    check_positive,
    check_random_state,
    check_tensor,
    to_numpy,
)

__all__ = ["GaussianMixtureQuerySampler", "make_mips_problem"]


class GaussianMixtureQuerySampler:
    """Draw queries from a mixture of Gaussians around unit anchors, renormalised.

    A query is ``normalize(a + noise * eps / sqrt(d))`` with ``a`` a uniformly
    chosen anchor and ``eps ~ N(0, I_d)``, so ``noise`` is the typical norm of the
    perturbation relative to the unit anchor. This mirrors the paper's training
    data: clustered, unit-norm text-embedding queries plus Gaussian copies.

    Parameters
    ----------
    anchors : array-like of shape (n_anchors, d)
        Mixture centres, finite; unit-norm ones make ``noise`` relative to their norm
        (they are used as given, not renormalised).
    noise : float
        Relative perturbation size (>= 0).
    normalize : bool, default=True
        Project the queries back onto the unit sphere.

    Examples
    --------
    >>> import numpy as np
    >>> from mlpapers.retrieval.amips import GaussianMixtureQuerySampler
    >>> sampler = GaussianMixtureQuerySampler(np.eye(3), noise=0.1)
    >>> q = sampler(5, np.random.default_rng(0))
    >>> q.shape, np.allclose(np.linalg.norm(q, axis=1), 1.0)
    ((5, 3), True)
    """

    def __init__(self, anchors: np.ndarray, noise: float, normalize: bool = True):
        check_bool(normalize, "normalize")
        # (finite: every query drawn near a NaN anchor was NaN; complex and text refused)
        self.anchors = to_numpy(check_tensor(anchors, name="anchors", dtype=torch.float64))
        self.noise = check_positive(noise, "noise", strict=False)
        self.normalize = normalize

    def __call__(self, n: int, rng=None) -> np.ndarray:
        """Return ``n`` queries of shape (n, d), float32; ``rng`` is a numpy Generator,
        RandomState, int or None."""
        n = int(check_positive(n, "n", integer=True))
        if not isinstance(rng, np.random.Generator):
            rng = np.random.default_rng(check_random_state(rng, "rng").randint(2**31 - 1))
        d = self.anchors.shape[1]
        a = self.anchors[rng.integers(0, len(self.anchors), size=n)]
        eps = rng.standard_normal((n, d))
        with np.errstate(over="ignore"):
            q = a + self.noise / np.sqrt(d) * eps
            norms = np.linalg.norm(q, axis=1, keepdims=True)
        if self.normalize:
            huge = ~np.isfinite(norms[:, 0])
            if huge.any():
                # the squared norm overflowed (noise above ~1e150) and every query became
                # 0: the same directions from a / noise + eps / sqrt(d)
                q[huge] = a[huge] / self.noise + eps[huge] / np.sqrt(d)
                norms[huge] = np.linalg.norm(q[huge], axis=1, keepdims=True)
            q /= np.maximum(norms, 1e-12)
        elif not np.isfinite(q).all() or np.abs(q).max(initial=0.0) > np.finfo(np.float32).max:
            raise ValueError(f"noise={self.noise!r} gives queries beyond float32's range; "
                             f"lower it or pass normalize=True.")
        return q.astype(np.float32)

    def __repr__(self) -> str:
        return (f"GaussianMixtureQuerySampler(n_anchors={len(self.anchors)}, "
                f"d={self.anchors.shape[1]}, noise={self.noise})")


def make_mips_problem(
    n_keys: int = 1000,
    n_features: int = 16,
    *,
    n_queries: int = 1000,
    n_anchors: int = 64,
    query_noise: float = 0.5,
    norm_spread: float = 0.25,
    random_state: RandomStateLike = None,
) -> tuple[np.ndarray, np.ndarray, GaussianMixtureQuerySampler]:
    """Make a synthetic MIPS problem: keys with varied norms and clustered queries.

    Keys are isotropic Gaussian directions scaled by log-normal norms
    ``exp(norm_spread * N(0, 1))``, so that the inner-product winner is not
    the cosine winner. Queries come from a
    :class:`~mlpapers.retrieval.amips.GaussianMixtureQuerySampler`
    with ``n_anchors`` unit anchors and relative noise ``query_noise``,
    renormalised to the unit sphere (as sentence embeddings are).

    Parameters
    ----------
    n_keys : int, default=1000
        Size of the database ``N``.
    n_features : int, default=16
        Dimension ``d``.
    n_queries : int, default=1000
        Number of held-out test queries returned (``0`` allowed).
    n_anchors : int, default=64
        Number of mixture components of the query distribution.
    query_noise : float, default=0.5
        Relative size of the perturbation around an anchor.
    norm_spread : float, default=0.25
        Standard deviation of the log key norms (``0``: unit keys, MIPS = cosine). A
        spread whose norms leave float32's normal range (above about 25 for a
        thousand keys) raises ``ValueError``.
    random_state : int, RandomState, Generator or None, default=None
        Seed of the keys, the anchors and the test queries; an int gives the same
        problem on every call.

    Returns
    -------
    keys : ndarray of shape (n_keys, n_features), float32
        The database.
    queries : ndarray of shape (n_queries, n_features), float32
        Test queries drawn from ``sampler``.
    sampler : GaussianMixtureQuerySampler
        Callable ``sampler(n, rng)`` for training queries (pass it as
        ``AmortizedMIPS().fit(keys, queries=sampler)``).

    Examples
    --------
    >>> from mlpapers.datasets import make_mips_problem
    >>> keys, queries, sampler = make_mips_problem(100, 8, n_queries=10, random_state=0)
    >>> keys.shape, queries.shape, sampler(3, 0).shape
    ((100, 8), (10, 8), (3, 8))
    """
    check_positive(n_keys, "n_keys", integer=True)
    check_positive(n_features, "n_features", integer=True)
    check_positive(n_queries, "n_queries", strict=False, integer=True)
    check_positive(n_anchors, "n_anchors", integer=True)
    # (as floats: a Fraction passed the check and failed in np.exp)
    query_noise = float(check_positive(query_noise, "query_noise", strict=False))
    norm_spread = float(check_positive(norm_spread, "norm_spread", strict=False))
    rng = check_random_state(random_state)
    dirs = rng.standard_normal((n_keys, n_features))
    # in place, norms in row chunks: one float64 copy of the keys at a time (the same
    # values as ``dirs / norm(dirs) * norms``, without its two temporaries)
    rows = max(1, 2**18 // n_features)
    for s in range(0, n_keys, rows):
        block = dirs[s:s + rows]
        block /= np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
    with np.errstate(over="ignore", under="ignore"):  # (refused below, by name)
        norms = np.exp(norm_spread * rng.standard_normal((n_keys, 1)))
    # a norm beyond float32's range became an infinite key, with only numpy's cast
    # warning; below its normal range (the largest entry of a key is at least
    # norm / sqrt(d)) a key became subnormal or zero
    f32 = np.finfo(np.float32)
    if norms.max() > f32.max or norms.min() < f32.tiny * np.sqrt(n_features):
        raise ValueError(f"norm_spread={norm_spread!r} gives key norms beyond float32's range "
                         f"(from {norms.min():.3g} to {norms.max():.3g}); use a smaller "
                         f"norm_spread (the log norms have this standard deviation).")
    dirs *= norms
    keys = dirs.astype(np.float32)
    del dirs
    anchors = rng.standard_normal((n_anchors, n_features))
    anchors /= np.maximum(np.linalg.norm(anchors, axis=1, keepdims=True), 1e-12)
    sampler = GaussianMixtureQuerySampler(anchors, query_noise)
    queries = (sampler(n_queries, np.random.default_rng(rng.randint(2**31 - 1)))
               if n_queries else np.zeros((0, n_features), np.float32))
    return keys, queries, sampler
