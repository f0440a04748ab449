"""Parity of RBE code paths that claim to agree (each test names its two paths)."""

import warnings

import numpy as np
import pytest
import torch

from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
    AnnCURRetriever,
    RelevanceBasedRetriever,
    cur_query_weights,
    fit_linear_embeddings,
    hit_rate,
    select_support,
)
from mlpapers.retrieval.rbe._kernels import stable_topk, topk_scores

pytestmark = pytest.mark.filterwarnings("ignore:greedy support selection stopped")


def heavy(q, i):
    q, i = np.asarray(q, dtype=np.float64), np.asarray(i, dtype=np.float64)
    return np.tanh(q @ i.T) + 0.1 * (q[:, :1] * i[:, :1].T) ** 2


def dot(q, i):
    return np.asarray(q, dtype=np.float64) @ np.asarray(i, dtype=np.float64).T


def data(seed, nq=40, n_test=6, n_items=23, d=5):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((nq, d)), rng.standard_normal((n_test, d)),
            rng.standard_normal((n_items, d)))


def integer_data(seed, nq=30, n_test=5, n_items=25, d=3):
    """Integer features: integer, rank-3 relevance with many exact ties."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-2, 3, (nq, d)).astype(float),
            rng.integers(-2, 3, (n_test, d)).astype(float),
            rng.integers(-2, 3, (n_items, d)).astype(float))


def stable_top(P, k):
    return np.argsort(-P, axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("center", [True, False])
def test_greedy_gram_and_lowrank_both_make_best_picks_on_exact_ties(seed, center):
    """greedy_method="gram" vs "lowrank" on relevance with exact ties (integer, rank-3
    relevance and duplicated items): rounding may break a tie differently in each
    form (as np.argmax in the notebooks), but every pick of both is a best greedy pick
    (the brute-force largest training-MSE decrease given its earlier picks, to
    rounding) and its recorded gain is that decrease."""
    Qtr, _, items = integer_data(seed)
    R = dot(Qtr, items)
    for M in (R, np.concatenate([R, R[:, :5]], axis=1)):
        X = M - M.mean(0) if center else M

        def residual(cols, X=X):
            if not cols:
                return float((X ** 2).sum())
            A = X[:, cols]
            return float(((X - A @ np.linalg.lstsq(A, X, rcond=None)[0]) ** 2).sum())

        for method in ("gram", "lowrank"):
            picks, gains = select_support(M, 4, "greedy", center=center,
                                          greedy_method=method, return_scores=True)
            picks = [int(j) for j in picks]
            scale = float((X ** 2).sum())
            for t in range(len(picks)):
                before = residual(picks[:t])
                best = max(before - residual(picks[:t] + [c])
                           for c in range(X.shape[1]) if c not in picks[:t])
                made = before - residual(picks[:t + 1])
                assert made >= best - 1e-9 * scale, (method, t)
                assert gains[t] == pytest.approx(made / X.size, rel=1e-6, abs=1e-12 * scale)


@pytest.mark.parametrize("support", ["greedy", "random", "kmeans", "farthest", "popular"])
@pytest.mark.parametrize("standardize", [True, False])
def test_fit_with_relevance_fn_equals_fit_with_relevance_matrix(support, standardize):
    """fit(train, items) (relevance_fn) vs fit(train, items, relevance_matrix=R)."""
    Qtr, Qte, items = data(1)
    kw = dict(n_support=6, support=support, standardize=standardize, random_state=0)
    a = RelevanceBasedRetriever(heavy, **kw).fit(Qtr, items)
    b = RelevanceBasedRetriever(heavy, **kw).fit(Qtr, items, relevance_matrix=heavy(Qtr, items))
    np.testing.assert_array_equal(a.support_indices_, b.support_indices_)
    np.testing.assert_array_equal(a.item_embeddings_, b.item_embeddings_)
    np.testing.assert_array_equal(a.predict(Qte), b.predict(Qte))
    assert (a.n_heavy_calls_, b.n_heavy_calls_) == (Qtr.shape[0] * items.shape[0], 0)


@pytest.mark.parametrize("head", ["linear", "mlp"])
@pytest.mark.parametrize("batch_size", [1, 4, 1024])
def test_kneighbors_is_the_stable_top_of_predict(head, batch_size):
    """kneighbors (chunked top-k) vs a stable descending sort of predict, with ties."""
    Qtr, Qte, items = integer_data(2)
    est = RelevanceBasedRetriever(dot, n_support=3, support="random", head=head,
                                  max_iter=20, eval_every=10, mlp_hidden=4,
                                  batch_size=batch_size, random_state=0).fit(Qtr, items)
    P = est.predict(Qte)
    for k in (1, 4, items.shape[0]):
        s, idx = est.kneighbors(Qte, n_neighbors=k)
        np.testing.assert_array_equal(idx, stable_top(P, k))
        np.testing.assert_array_equal(s, np.take_along_axis(P, idx, 1))


def test_predict_does_not_depend_on_batch_size():
    """predict / kneighbors with batch_size=1 vs one chunk (linear head, float64)."""
    Qtr, Qte, items = data(3)
    a = RelevanceBasedRetriever(heavy, n_support=5, random_state=0).fit(
        Qtr, items, relevance_matrix=heavy(Qtr, items))
    P = a.predict(Qte)
    a.set_params(batch_size=1)
    np.testing.assert_allclose(a.predict(Qte), P, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(a.kneighbors(Qte, 5, return_distance=False), stable_top(P, 5))


def test_topk_scores_chunks_equal_a_full_stable_sort():
    """topk_scores (chunks of 1, 2, all rows) vs argsort(stable=True) of the full matrix."""
    g = torch.Generator().manual_seed(0)
    S = torch.randint(0, 4, (7, 13), generator=g).double()
    for k in (1, 3, 13):
        want = torch.argsort(S, dim=1, descending=True, stable=True)[:, :k]
        assert torch.equal(stable_topk(S, k)[1], want)
        for bs in (1, 2, 100):
            v, i = topk_scores(lambda a, b: S[a:b], 7, k, batch_size=bs, n_items=13)
            assert torch.equal(i, want) and torch.equal(v, S.gather(1, want))


@pytest.mark.parametrize("standardize", [True, False])
@pytest.mark.parametrize("n_rerank", [1, 4, 10])
def test_rerank_equals_heavy_sort_of_predicted_candidates(standardize, n_rerank):
    """kneighbors with n_rerank vs re-ranking predict's top n_rerank by hand."""
    Qtr, Qte, items = integer_data(4)
    est = RelevanceBasedRetriever(dot, n_support=3, support="random", n_rerank=n_rerank,
                                  standardize=standardize, random_state=0).fit(Qtr, items)
    cand = stable_top(est.predict(Qte), n_rerank)
    H = np.take_along_axis(dot(Qte, items), cand, 1)
    k = min(n_rerank, 3)
    want = np.array([[c for _, c in sorted(zip(-h, c))][:k] for h, c in zip(H, cand)])
    s, idx = est.kneighbors(Qte, n_neighbors=k)
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(s, np.take_along_axis(dot(Qte, items), want, 1))


def test_rerank_of_every_item_is_brute_force():
    """kneighbors with n_rerank=n_items vs the heavy ranker's stable top-k."""
    Qtr, Qte, items = integer_data(5)
    est = RelevanceBasedRetriever(dot, n_support=3, n_rerank=items.shape[0]).fit(Qtr, items)
    np.testing.assert_array_equal(est.kneighbors(Qte, 4, return_distance=False),
                                  stable_top(dot(Qte, items), 4))


def test_anncur_equals_rbe_with_random_unstandardised_supports():
    """AnnCURRetriever vs RelevanceBasedRetriever(support="random", standardize=False)."""
    Qtr, Qte, items = data(6)
    a = AnnCURRetriever(heavy, n_support=6, random_state=3).fit(Qtr, items)
    b = RelevanceBasedRetriever(heavy, n_support=6, support="random", standardize=False,
                                random_state=3).fit(Qtr, items)
    np.testing.assert_array_equal(a.support_indices_, b.support_indices_)
    np.testing.assert_array_equal(a.predict(Qte), b.predict(Qte))


@pytest.mark.parametrize("seed", range(3))
def test_adacur_one_round_is_cur_on_its_anchors(seed):
    """AdaCURRetriever(n_rounds=1) vs CUR (RBE, standardize=False) on the same anchors:
    equal off the anchors, the exact heavy scores at them; also on rank-deficient
    relevance (rank 3 < 6 anchors), where the two pseudo-inverse cutoffs differ."""
    Qtr, Qte, items = data(seed)
    for fn in (heavy, dot):
        ada = AdaCURRetriever(fn, n_calls=6, n_rounds=1, random_state=seed).fit(Qtr, items)
        cur = RelevanceBasedRetriever(fn, n_support=6, support=ada.initial_anchors_,
                                      standardize=False).fit(Qtr, items)
        P, anchors = ada.predict(Qte, return_anchors=True)
        off = np.ones(P.shape, bool)
        np.put_along_axis(off, anchors, False, 1)
        np.testing.assert_allclose(P[off], cur.predict(Qte)[off], rtol=1e-8, atol=1e-8)
        np.testing.assert_array_equal(np.take_along_axis(P, anchors, 1),
                                      np.take_along_axis(fn(Qte, items), anchors, 1))


def test_adacur_paths_agree():
    """AdaCUR: kneighbors vs predict's stable top (ties); batch_size 1 vs default;
    relevance_fn vs relevance_matrix; a budget of every item vs the heavy ranker."""
    Qtr, Qte, items = integer_data(7)
    kw = dict(n_calls=6, n_rounds=3, random_state=0)
    ada = AdaCURRetriever(dot, **kw).fit(Qtr, items)
    P = ada.predict(Qte)
    np.testing.assert_array_equal(ada.kneighbors(Qte, 5, return_distance=False),
                                  stable_top(P, 5))
    one = AdaCURRetriever(dot, batch_size=1, **kw).fit(Qtr, items,
                                                       relevance_matrix=dot(Qtr, items))
    np.testing.assert_allclose(one.predict(Qte), P, rtol=0, atol=1e-9)
    full = AdaCURRetriever(dot, n_calls=items.shape[0], n_rounds=3).fit(Qtr, items)
    np.testing.assert_array_equal(full.predict(Qte), dot(Qte, items))


def test_cur_query_weights_equal_fit_linear_embeddings():
    """cur_query_weights (ADACUR's eigh solve) vs fit_linear_embeddings (pinv, plain CUR)."""
    Qtr, Qte, items = data(8)
    A, I = torch.as_tensor(heavy(Qtr, items)), torch.tensor([0, 3, 5, 9, 11])
    u = torch.as_tensor(heavy(Qte, items))[:, I]
    lin = fit_linear_embeddings(A[:, I], A, standardize=False)
    w = cur_query_weights(A[:, I].T.expand(len(u), -1, -1).contiguous(), u)
    torch.testing.assert_close(w @ A, u @ lin["embeddings"].T, rtol=1e-9, atol=1e-9)


def test_torch_and_numpy_inputs_agree():
    """fit/predict on numpy arrays vs the same data as torch tensors."""
    Qtr, Qte, items = data(9)
    a = RelevanceBasedRetriever(heavy, n_support=5, random_state=0).fit(Qtr, items)
    b = RelevanceBasedRetriever(heavy, n_support=5, random_state=0).fit(
        torch.as_tensor(Qtr), torch.as_tensor(items))
    np.testing.assert_array_equal(a.support_indices_, b.support_indices_)
    np.testing.assert_array_equal(a.predict(Qte), b.predict(torch.as_tensor(Qte)))


def test_score_with_and_without_relevance_and_hit_rate_agree():
    """score(Q) (heavy ground truth, chunked) vs score(Q, relevance) vs hit_rate."""
    Qtr, Qte, items = data(10)
    est = RelevanceBasedRetriever(heavy, n_support=5, batch_size=2).fit(Qtr, items)
    H = heavy(Qte, items)
    idx = est.kneighbors(Qte, 3, return_distance=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert est.score(Qte, n_neighbors=3) == est.score(Qte, H, 3) == hit_rate(H, idx, 3)
