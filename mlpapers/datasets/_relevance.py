"""A synthetic "heavy ranker": a nonlinear query-item relevance with a low-rank core."""

from __future__ import annotations

import numpy as np

from mlpapers._utils import (
    RandomStateLike,
    check_positive,
    check_random_state,
    check_tensor,
    to_numpy,
)


class SyntheticRelevance:
    """Deterministic heavy-ranker relevance ``f(queries, items) -> scores``.

    The score of query features :math:`x` and item features :math:`y` is

    .. math::

        f(x, y) = \\frac{(A x)^\\top (B y)}{\\sqrt{r}}
        + \\lambda\\, w^\\top \\tanh(U x + V y + c) + \\beta^\\top y,

    a rank-:math:`r` bilinear part, a non-separable one-hidden-layer interaction
    (full rank as a matrix over query x item pairs) scaled by ``nonlinearity``,
    and an item popularity term. Instances are created by
    :func:`make_relevance_problem`; calling one scores every query against every
    item (a cross product), in query chunks so memory stays bounded.

    Parameters
    ----------
    A, B : ndarray of shape (rank, n_features)
        Bilinear factors.
    U, V : ndarray of shape (n_hidden, n_features)
        Interaction weights.
    c, w : ndarray of shape (n_hidden,)
        Interaction bias and output weights (``w`` already scaled by ``nonlinearity``).
    beta : ndarray of shape (n_features,)
        Popularity direction.
    """

    def __init__(self, A, B, U, V, c, w, beta):
        self.A, self.B, self.U, self.V = A, B, U, V
        self.c, self.w, self.beta = c, w, beta

    def __call__(self, queries, items) -> np.ndarray:
        """Score every query against every item.

        Parameters
        ----------
        queries : array-like or Tensor of shape (n_q, n_features)
            Query feature vectors (numpy array, torch tensor or nested lists).
        items : array-like or Tensor of shape (n_i, n_features)
            Item feature vectors.

        Returns
        -------
        ndarray of shape (n_q, n_i), float64
            ``f(queries[a], items[b])`` at ``[a, b]`` (the formula of the class),
            computed in query chunks of bounded memory.
        """
        Xq = to_numpy(check_tensor(queries, name="queries", dtype="float64"))
        Xi = to_numpy(check_tensor(items, name="items", dtype="float64"))
        d = self.A.shape[1]
        for name, X in (("queries", Xq), ("items", Xi)):
            if X.shape[1] != d:
                raise ValueError(f"{name} must have {d} features, got {X.shape[1]}.")
        r = self.A.shape[0]
        out = (Xq @ self.A.T) @ (Xi @ self.B.T).T  # in place below: no (n, N) temporaries
        out /= np.sqrt(r)
        out += (Xi @ self.beta)[None, :]
        hq = Xq @ self.U.T + self.c  # (n, H)
        hi = Xi @ self.V.T  # (N, H)
        chunk = max(1, 2_000_000 // max(1, hi.size))
        for s in range(0, len(Xq), chunk):
            h = hq[s:s + chunk, None, :] + hi[None, :, :]  # (c, N, H)
            out[s:s + chunk] += np.tanh(h, out=h) @ self.w
        return out

    def __repr__(self) -> str:
        return (f"SyntheticRelevance(rank={self.A.shape[0]}, n_features={self.A.shape[1]}, "
                f"n_hidden={self.U.shape[0]})")


def make_relevance_problem(
    n_queries: int = 2000,
    n_items: int = 1000,
    *,
    n_features: int = 16,
    rank: int = 8,
    nonlinearity: float = 0.5,
    n_clusters: int = 20,
    cluster_std: float = 0.3,
    popularity: float = 0.3,
    n_hidden: int = 32,
    random_state: RandomStateLike = None,
) -> tuple[np.ndarray, np.ndarray, SyntheticRelevance]:
    """Queries, items and a nonlinear "heavy ranker" scoring them.

    A stand-in for an expensive cross-encoder, for relevance-based embeddings
    (:class:`mlpapers.retrieval.rbe.RelevanceBasedRetriever`). Queries and items
    are feature vectors; the returned ``relevance_fn`` (a
    ``SyntheticRelevance``) scores every query against every item with a
    low-rank bilinear part plus a non-separable ``tanh`` interaction, so the
    relevance matrix is *not* exactly low rank when ``nonlinearity > 0``.
    Items come from a Gaussian mixture with Zipf-distributed cluster sizes, so
    a few clusters are large and many are small: uniform (random) support items
    tend to miss the small clusters.

    Parameters
    ----------
    n_queries : int, default=2000
        Number of queries (split them into train/test yourself).
    n_items : int, default=1000
        Number of items.
    n_features : int, default=16
        Dimension of the query and item feature vectors.
    rank : int, default=8
        Rank of the bilinear part.
    nonlinearity : float, default=0.5
        Weight of the non-separable interaction (``0`` gives a relevance matrix of
        rank at most ``min(rank + 1, n_features)``: the bilinear part plus the
        popularity term, both linear in the item features).
    n_clusters : int, default=20
        Number of item clusters; cluster ``j`` has probability
        proportional to ``1 / (j + 1)``.
    cluster_std : float, default=0.3
        Standard deviation of items around their cluster centre (centres are
        standard normal).
    popularity : float, default=0.3
        Scale of the item popularity term :math:`\\beta^\\top y`.
    n_hidden : int, default=32
        Width of the interaction layer.
    random_state : int, RandomState, Generator or None, default=None
        Seed for features and ranker weights.

    Returns
    -------
    queries : ndarray of shape (n_queries, n_features), float64
        Query features (standard normal).
    items : ndarray of shape (n_items, n_features), float64
        Item features.
    relevance_fn : SyntheticRelevance
        Deterministic callable ``relevance_fn(queries, items) -> (n_q, n_i)``.

    Examples
    --------
    >>> from mlpapers.datasets import make_relevance_problem
    >>> Q, I, f = make_relevance_problem(n_queries=5, n_items=7, random_state=0)
    >>> f(Q, I).shape
    (5, 7)
    """
    for name, val in (("n_queries", n_queries), ("n_items", n_items),
                      ("n_features", n_features), ("rank", rank),
                      ("n_clusters", n_clusters), ("n_hidden", n_hidden)):
        check_positive(val, name, integer=True)
    # (as floats: a Fraction passed the check and made object arrays)
    nonlinearity, cluster_std, popularity = (
        float(check_positive(level, name, strict=False))
        for name, level in (("nonlinearity", nonlinearity), ("cluster_std", cluster_std),
                            ("popularity", popularity)))
    rng = check_random_state(random_state)
    d = n_features
    queries = rng.standard_normal((n_queries, d))
    centres = rng.standard_normal((n_clusters, d))
    p = 1.0 / np.arange(1, n_clusters + 1)
    labels = rng.choice(n_clusters, size=n_items, p=p / p.sum())
    with np.errstate(over="ignore", invalid="ignore"):  # (refused below, by name)
        items = centres[labels] + cluster_std * rng.standard_normal((n_items, d))
    A = rng.standard_normal((rank, d)) / np.sqrt(d)
    B = rng.standard_normal((rank, d)) / np.sqrt(d)
    U = 1.5 * rng.standard_normal((n_hidden, d)) / np.sqrt(d)
    V = 1.5 * rng.standard_normal((n_hidden, d)) / np.sqrt(d)
    c = 0.5 * rng.standard_normal(n_hidden)
    with np.errstate(over="ignore", invalid="ignore"):  # (refused below, by name)
        w = nonlinearity * rng.standard_normal(n_hidden) / np.sqrt(n_hidden)
        beta = popularity * rng.standard_normal(d) / np.sqrt(d)
        # bounds of the scaled terms (|tanh| <= 1): beyond float64 the relevance is NaN or
        # infinite; the items' spread enters through the low-rank and hidden terms
        # (in units of the largest entry: the squares of entries beyond 1e154 overflow)
        top = np.abs(items).max()
        item_norm = top * np.linalg.norm(items / top, axis=1).max() if 0 < top < np.inf else top
        query_norm = np.linalg.norm(queries, axis=1).max()
        spread = item_norm * max(np.linalg.norm(A) * np.linalg.norm(B) * query_norm,
                                 np.linalg.norm(U))
        bounds = (("cluster_std", cluster_std, 4.0 * spread),
                  ("nonlinearity", nonlinearity, np.abs(w).sum()),
                  ("popularity", popularity, np.abs(beta).sum() * np.abs(items).max()))
    for name, level, bound in bounds:
        if not np.isfinite(bound):
            raise ValueError(f"{name}={level!r} puts the relevance beyond float64's range; "
                             "lower it.")
    return queries, items, SyntheticRelevance(A, B, U, V, c, w, beta)
