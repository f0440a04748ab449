"""AdaCURRetriever (adaptive multi-round CUR) and its kernel: references, accounting, errors."""

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from mlpapers.datasets._relevance import make_relevance_problem
from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
    AnnCURRetriever,
    cur_query_weights,
    hit_rate,
)

from ._counting import CatStorageSpy, CountingRelevance


@pytest.fixture(scope="module")
def problem():
    Q, I, f = make_relevance_problem(230, 120, random_state=1)
    return Q, I, f, f(Q, I)


def _reference_adacur(A, R_te, first, sizes):
    """Literal ADACUR with numpy pinv, one query at a time."""
    out_s, out_i = [], []
    for q in range(R_te.shape[0]):
        I = list(first)
        for r in range(1, len(sizes) + 1):
            s = R_te[q, I] @ np.linalg.pinv(A[:, I]) @ A
            if r == len(sizes):
                break
            masked = s.copy()
            masked[I] = -np.inf
            I += list(np.argsort(-masked, kind="stable")[:sizes[r]])
        s[I] = R_te[q, I]
        out_s.append(s)
        out_i.append(I)
    return np.array(out_s), np.array(out_i)


def test_cur_query_weights_match_pinv_reference():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((25, 40))
    A[:, 7] = 2.0 * A[:, 3]  # a rank-deficient anchor set below
    I = np.array([[1, 5, 9, 11, 30], [3, 7, 12, 20, 39]])
    u = rng.standard_normal((2, 5))
    C = torch.as_tensor(A.T[I])
    w = cur_query_weights(C, torch.as_tensor(u)).numpy()
    ref = np.stack([u[b] @ np.linalg.pinv(A[:, I[b]]) for b in range(2)])
    np.testing.assert_allclose(w, ref, atol=1e-9)
    # ridge: w = A_I (A_I^T A_I + lam I)^{-1} u
    w = cur_query_weights(C, torch.as_tensor(u), ridge=0.5).numpy()
    AI = A[:, I[0]]
    np.testing.assert_allclose(w[0], AI @ np.linalg.solve(AI.T @ AI + 0.5 * np.eye(5), u[0]),
                               atol=1e-10)


def test_adacur_equals_literal_reference(problem):
    Q, I, f, R = problem
    est = AdaCURRetriever(f, n_calls=11, n_rounds=3, random_state=0)
    est.fit(Q[:200], I, relevance_matrix=R[:200])
    assert est.round_sizes_.tolist() == [4, 4, 3] and est.round_sizes_.sum() == 11
    S, anchors = est.predict(Q[200:], return_anchors=True)
    ref_s, ref_i = _reference_adacur(R[:200], R[200:], est.initial_anchors_, [4, 4, 3])
    np.testing.assert_array_equal(anchors, ref_i)
    np.testing.assert_allclose(S, ref_s, atol=1e-8)
    assert all(len(set(row)) == 11 for row in anchors.tolist())  # no item scored twice
    np.testing.assert_array_equal(anchors[:, :4], np.tile(est.initial_anchors_, (30, 1)))


def test_one_round_is_anncur(problem):
    Q, I, f, R = problem
    ada = AdaCURRetriever(f, n_calls=10, n_rounds=1, random_state=3)
    cur = AnnCURRetriever(f, n_support=10, random_state=3)
    ada.fit(Q[:200], I, relevance_matrix=R[:200])
    cur.fit(Q[:200], I, relevance_matrix=R[:200])
    np.testing.assert_array_equal(ada.initial_anchors_, cur.support_indices_)
    np.testing.assert_allclose(ada.predict(Q[200:]), cur.predict(Q[200:]), atol=1e-8)


def test_heavy_call_accounting(problem):
    Q, I, f, R = problem
    heavy = CountingRelevance(f)
    est = AdaCURRetriever(heavy, n_calls=13, n_rounds=4, batch_size=64, random_state=0)
    est.fit(Q[:200], I)
    assert heavy.pairs == 200 * 120 == est.n_heavy_calls_
    for method in ("predict", "kneighbors"):
        heavy.pairs = 0
        getattr(est, method)(Q[200:])
        assert heavy.pairs == 30 * 13 == 30 * est.n_calls_per_query_
    est.fit(Q[:200], I, relevance_matrix=R[:200])
    assert est.n_heavy_calls_ == 0


def test_low_rank_relevance_is_retrieved_exactly():
    rng = np.random.default_rng(0)
    Q, I = rng.standard_normal((50, 3)), rng.standard_normal((40, 3))
    f = lambda q, i: np.asarray(q) @ np.asarray(i).T  # noqa: E731
    est = AdaCURRetriever(f, n_calls=8, n_rounds=2, init="greedy").fit(Q[:40], I)
    # greedy stops after 3 = rank items; the first round is filled to 4 at random
    assert len(np.unique(est.initial_anchors_)) == 4
    R_te = f(Q[40:], I)
    np.testing.assert_allclose(est.predict(Q[40:]), R_te, atol=1e-8)
    scores, idx = est.kneighbors(Q[40:], n_neighbors=5)
    assert hit_rate(R_te, idx) == 1.0
    np.testing.assert_allclose(scores, np.take_along_axis(R_te, idx, 1), atol=1e-8)


def test_adaptive_rounds_beat_anncur_at_equal_budget():
    """The ADACUR paper's claim in small: adaptive anchors raise top-k recall."""
    Q, I, f = make_relevance_problem(600, 500, random_state=0)
    R = f(Q, I)
    fit = dict(relevance_matrix=R[:500])
    cur = np.mean([AnnCURRetriever(f, n_support=20, random_state=s).fit(Q[:500], I, **fit)
                   .score(Q[500:], R[500:], 10) for s in range(3)])
    ada = np.mean([AdaCURRetriever(f, n_calls=20, n_rounds=4, random_state=s)
                   .fit(Q[:500], I, **fit).score(Q[500:], R[500:], 10) for s in range(3)])
    assert ada > cur + 0.05


def test_determinism_and_global_rng(problem):
    Q, I, f, R = problem
    a = AdaCURRetriever(f, n_calls=9, n_rounds=3, random_state=5)
    b = clone(a)
    state = torch.get_rng_state()
    a.fit(Q[:200], I, relevance_matrix=R[:200])
    b.fit(Q[:200], I, relevance_matrix=R[:200])
    np.testing.assert_array_equal(a.kneighbors(Q[200:], 7, return_distance=False),
                                  b.kneighbors(Q[200:], 7, return_distance=False))
    assert torch.equal(state, torch.get_rng_state())


def test_save_load_round_trip(tmp_path, problem):
    Q, I, f, R = problem
    est = AdaCURRetriever(f, n_calls=6, n_rounds=2, random_state=0)
    est.fit(Q[:200], I, relevance_matrix=R[:200])
    path = tmp_path / "adacur.pt"
    est.save(path)
    with pytest.raises(TypeError, match="relevance_fn"):
        AdaCURRetriever.load(path)
    back = AdaCURRetriever.load(path, relevance_fn=f, items=I)
    np.testing.assert_array_equal(back.predict(Q[200:]), est.predict(Q[200:]))
    # AnnCUR files keep loading after the baselines moved module
    cur = AnnCURRetriever(f, n_support=4, random_state=0).fit(Q[:200], I,
                                                              relevance_matrix=R[:200])
    cur.save(tmp_path / "cur.pt")
    payload = torch.load(tmp_path / "cur.pt", weights_only=True)
    payload["class"] = "mlpapers.retrieval.rbe._estimator:AnnCURRetriever"  # old location
    torch.save(payload, tmp_path / "cur.pt")
    back = AnnCURRetriever.load(tmp_path / "cur.pt", relevance_fn=f, items=I)
    np.testing.assert_array_equal(back.predict(Q[200:]), cur.predict(Q[200:]))


def test_bad_input(problem):
    Q, I, f, R = problem
    fit = dict(relevance_matrix=R[:20])
    with pytest.raises(ValueError, match="n_calls=121"):
        AdaCURRetriever(f, n_calls=121).fit(Q[:20], I, **fit)
    with pytest.raises(ValueError, match="n_rounds=6"):
        AdaCURRetriever(f, n_calls=5, n_rounds=6).fit(Q[:20], I, **fit)
    with pytest.raises(ValueError, match="n_rounds"):
        AdaCURRetriever(f, n_calls=5, n_rounds=0).fit(Q[:20], I, **fit)
    with pytest.raises(ValueError, match="init must be one of"):
        AdaCURRetriever(f, n_calls=5, init="best").fit(Q[:20], I, **fit)
    with pytest.raises(TypeError, match="relevance_fn must be a callable"):
        AdaCURRetriever(None, n_calls=5).fit(Q[:20], I, **fit)
    with pytest.raises(ValueError, match="relevance_matrix must have shape"):
        AdaCURRetriever(f, n_calls=5).fit(Q[:20], I, relevance_matrix=R[:10])
    with pytest.raises(NotFittedError):
        AdaCURRetriever(f).predict(Q[:3])
    est = AdaCURRetriever(f, n_calls=6, n_rounds=2, random_state=0).fit(Q[:20], I, **fit)
    with pytest.raises(ValueError, match="n_neighbors=121"):
        est.kneighbors(Q[:2], n_neighbors=121)
    # a ranker failing only in the per-query (adaptive) rounds
    est.relevance_fn = lambda q, i: f(q, i) if len(q) > 1 else f(q, i)[:, :-1]
    with pytest.raises(ValueError, match="returned shape"):
        est.predict(Q[:3])
    est.relevance_fn = lambda q, i: f(q, i) if len(q) > 1 else f(q, i) * np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        est.predict(Q[:3])
    assert AdaCURRetriever._estimator_check_instances() == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(C=torch.randn(3, 5), u=torch.randn(3)), "C must be a 3-D"),
    (dict(C=torch.randn(2, 3, 5), u=torch.randn(2, 4)), "u must be"),
    (dict(C=torch.randn(2, 3, 5), u=torch.randn(2, 3), gram=torch.randn(2, 2, 2)), "gram"),
    (dict(C=torch.randn(2, 3, 5), u=torch.randn(2, 3), ridge=-1.0), "ridge"),
    (dict(C=torch.randn(2, 3, 5), u=torch.randn(2, 3), rcond=-0.1), "rcond"),
])
def test_cur_query_weights_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        cur_query_weights(**kwargs)


def test_kneighbors_memory_does_not_grow_with_queries_times_items(monkeypatch):
    """kneighbors keeps each chunk's top items only; it used to keep every chunk's
    (chunk, n_items) score matrix until the end (n_queries x n_items float64)."""
    rng = np.random.default_rng(0)
    n_q, N = 48, 400
    A, R_te = rng.standard_normal((20, N)), rng.standard_normal((n_q, N))
    f = lambda q, i: R_te[np.ix_(np.asarray(q), np.asarray(i))]  # noqa: E731
    est = AdaCURRetriever(f, n_calls=9, n_rounds=3, batch_size=4, random_state=0)
    est.fit(np.arange(20), np.arange(N), relevance_matrix=A)
    S, _ = est.predict(np.arange(n_q), return_anchors=True)
    ref = np.argsort(-S, axis=1, kind="stable")[:, :5]
    spy = CatStorageSpy(torch.cat)
    monkeypatch.setattr(torch, "cat", spy)
    s, idx = est.kneighbors(np.arange(n_q), 5)
    np.testing.assert_array_equal(idx, ref)
    np.testing.assert_allclose(s, np.take_along_axis(S, ref, 1))
    assert spy.max_bytes < n_q * N * 8 / 4  # chunks of 4 queries: ~ 4 * N * 8 bytes
