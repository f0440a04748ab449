"""Greedy support selection on relevance with a large common component.

Regression: relevance offset by 1e6 (raw scores, ``standardize=False``) keeps, after the
first pick, residuals 1e-12 of each item's norm. The deflation updates cancelled at the
scale of the first pick, and the tolerance relative to the item norm (default 1e-10)
excluded every item: greedy stopped after one support (HitRate@10 0.029 against 0.884
with the offset removed); with an offset of 1e3 the "lowrank" picks drifted from the
exact greedy after the second pick (HitRate 0.762).

The reference is the Gram-deflation greedy in 50-digit arithmetic on the same float64
values.
"""

import warnings

import mpmath
import numpy as np
import pytest
import torch

from mlpapers.datasets import make_relevance_problem
from mlpapers.retrieval.rbe import RelevanceBasedRetriever, greedy_selection, select_support


def _exact_greedy(X: np.ndarray, k: int) -> list[int]:
    """Greedy argmax_j ||G_j||^2 / G_jj with Gram deflation, in 50-digit arithmetic."""
    with mpmath.workdps(50):
        rows = [[mpmath.mpf(float(v)) for v in row] for row in X]
        N = len(rows)
        G = [[mpmath.fsum(a * b for a, b in zip(rows[i], rows[j])) for j in range(N)]
             for i in range(N)]
        d0 = [G[i][i] for i in range(N)]
        picks: list[int] = []
        for _ in range(k):
            best, best_score = None, None
            for j in range(N):
                if j in picks or G[j][j] <= mpmath.mpf(10) ** -30 * d0[j]:
                    continue
                score = mpmath.fsum(G[i][j] ** 2 for i in range(N)) / G[j][j]
                if best_score is None or score > best_score:
                    best, best_score = j, score
            if best is None:
                break
            picks.append(best)
            g = [G[i][best] for i in range(N)]
            G = [[G[i][j] - g[i] * g[j] / g[best] for j in range(N)] for i in range(N)]
    return picks


def _items(offset: float, n_q: int = 25, n_items: int = 30, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    R = rng.standard_normal((n_q, n_items)) + offset  # (queries, items)
    return R.T.copy()


@pytest.mark.parametrize("method", ["lowrank", "gram"])
@pytest.mark.parametrize("offset", [0.0, 1e3, 1e6, -3e5])
def test_greedy_matches_the_exact_greedy_under_a_common_offset(offset, method):
    X = _items(offset)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no early stop: every item still carries signal)
        idx, gains = greedy_selection(torch.as_tensor(X), 10, method=method)
    assert idx.tolist() == _exact_greedy(X, 10)


@pytest.mark.parametrize("method", ["lowrank", "gram"])
def test_greedy_matches_the_exact_greedy_on_a_spread_spectrum(method):
    # item vectors whose singular values fall from 1 to 1e-6: the column norms of the
    # deflated Gram matrix cancel at the scale of the first ones
    rng = np.random.default_rng(1)
    U = np.linalg.qr(rng.standard_normal((30, 12)))[0]
    V = np.linalg.qr(rng.standard_normal((25, 12)))[0]
    X = (U * np.logspace(0, -6, 12)) @ V.T
    # (11 picks: the residual left for the twelfth is rank one, where every gain ties)
    idx, _ = greedy_selection(torch.as_tensor(X), 11, method=method)
    assert idx.tolist() == _exact_greedy(X, 11)


@pytest.mark.parametrize("method", ["lowrank", "gram"])
def test_low_rank_relevance_plus_offset_stops_once_reproduced(method):
    # rank 3 plus a constant: rank 4 without centring, so exactly 4 picks reproduce it
    rng = np.random.default_rng(2)
    R = rng.standard_normal((40, 3)) @ rng.standard_normal((3, 50)) + 1e6
    with pytest.warns(UserWarning, match="stopped after 4 of 8"):
        S, gains = select_support(R, 8, "greedy", center=False, greedy_method=method,
                                  return_scores=True)
    assert len(set(S.tolist())) == 4
    A = R[:, S] - 1e6  # (the span of the picks holds the constant: exact fit of R - 1e6)
    coef, *_ = np.linalg.lstsq(np.hstack([A, np.ones((40, 1))]), R - 1e6, rcond=None)
    np.testing.assert_allclose(np.hstack([A, np.ones((40, 1))]) @ coef, R - 1e6, atol=1e-6)
    assert gains.sum() == pytest.approx(np.mean(R ** 2), rel=1e-12)


def test_tol_leaves_out_items_within_it_of_the_span():
    # every item's residual after the first pick is ~1e-12 of its squared norm: a tol
    # above that leaves them out (one pick), the default keeps them
    X = torch.as_tensor(_items(1e6))
    with pytest.warns(UserWarning, match="stopped after 1 of 5"):
        assert len(greedy_selection(X, 5, tol=1e-9)[0]) == 1
    assert len(greedy_selection(X, 5)[0]) == 5


def test_raw_relevance_with_an_offset_keeps_the_retrieval_quality():
    n_tr = 500
    Q, items, heavy = make_relevance_problem(n_tr + 200, 600, random_state=0)
    R = heavy(Q, items)
    truth = R[n_tr:]
    hits = []
    for offset in (0.0, 1e6):
        est = RelevanceBasedRetriever(lambda q, i, c=offset: heavy(q, i) + c, n_support=20,
                                      standardize=False, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            est.fit(Q[:n_tr], items, relevance_matrix=R[:n_tr] + offset)
        assert len(est.support_indices_) == 20
        hits.append(est.score(Q[n_tr:], truth + offset, n_neighbors=10))
    # (measured 0.888 and 0.884; 0.029 with the one support picked before)
    assert hits[1] >= hits[0] - 0.02, hits


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("offset", [0.0, 1e4, 1e6])
def test_an_offset_adds_no_rounding_noise_supports(offset, dtype):
    # exactly rank 5 (after centring; rank 6 with the constant without it): the
    # rounding of 1e6 + O(1) is no information. Before, greedy picked it: 30 supports
    # (gains of 1e-16 to 1e-24) instead of 5 with standardize=True at an offset of 1e4
    rng = np.random.default_rng(0)
    Q, I = rng.standard_normal((200, 5)), rng.standard_normal((120, 5))
    R = (offset + Q @ I.T).astype(dtype)
    for center, rank in ((True, 5), (False, 6 if offset else 5)):
        with pytest.warns(UserWarning, match=f"stopped after {rank} of 30"):
            S = select_support(R, 30, "greedy", center=center)
        assert len(S) == rank


def test_an_offset_keeps_the_retriever_at_the_rank_of_the_relevance():
    rng = np.random.default_rng(0)
    Q, I = rng.standard_normal((300, 5)), rng.standard_normal((200, 5))
    for offset in (0.0, 1e4, 1e6):
        est = RelevanceBasedRetriever(lambda q, i, c=offset: c + np.asarray(q) @ np.asarray(i).T,
                                      n_support=30, random_state=0)
        with pytest.warns(UserWarning, match="stopped after 5 of 30"):
            est.fit(Q[:200], I)
        assert est.n_calls_per_query_ == 5
        assert est.score(Q[200:], n_neighbors=10) == 1.0
