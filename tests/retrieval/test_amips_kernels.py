"""Exact search and retrieval metrics of amortized MIPS against numpy references."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.retrieval import (
    ExactMIPS,
    amips_loss,
    match_rate,
    mean_reciprocal_rank,
    mips_topk,
    recall_at_k,
    support_function,
)
from mlpapers.retrieval.amips import rank_by_key
from mlpapers.retrieval.amips._kernels import warmup_cosine_lr


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 30), N=st.integers(1, 40), d=st.integers(1, 6),
       k=st.integers(1, 5), chunk=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_mips_topk_matches_bruteforce(n, N, d, k, chunk, seed):
    k = min(k, N)
    rng = np.random.default_rng(seed)
    Q, K = rng.standard_normal((n, d)), rng.standard_normal((N, d))
    s, i = mips_topk(torch.from_numpy(Q), torch.from_numpy(K), k, batch_size=chunk)
    ref = Q @ K.T
    order = np.argsort(-ref, axis=1, kind="stable")[:, :k]
    np.testing.assert_allclose(s.numpy(), np.take_along_axis(ref, order, 1), rtol=1e-12)
    # indices agree up to exact ties (continuous data: none)
    np.testing.assert_array_equal(i.numpy(), order)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20), N=st.integers(1, 30), d=st.integers(1, 5),
       k=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_rank_by_key_matches_bruteforce(n, N, d, k, seed):
    k = min(k, N)
    rng = np.random.default_rng(seed)
    P, K = rng.standard_normal((n, d)), rng.standard_normal((N, d)) * rng.uniform(0.2, 3, (N, 1))
    Pt, Kt = torch.from_numpy(P), torch.from_numpy(K)
    ip = rank_by_key(Pt, Kt, k, metric="ip", batch_size=7).numpy()
    np.testing.assert_array_equal(ip, np.argsort(-(P @ K.T), axis=1, kind="stable")[:, :k])
    l2 = rank_by_key(Pt, Kt, k, metric="l2", batch_size=7).numpy()
    dist = ((P[:, None, :] - K[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(l2, np.argsort(dist, axis=1, kind="stable")[:, :k])


def test_support_function_ties_go_to_lowest_index():
    K = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    v, i = support_function(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), K)
    assert i.tolist() == [0, 0]  # first query: keys 0, 1 tie; second: all three tie
    assert v.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_mips_topk_orders_ties_by_index_like_a_stable_sort(chunk):
    # regression: torch.topk ordered exactly tied keys arbitrarily, so
    # kneighbors(X, k)[:, 0] could differ from predict(X) (the lowest-index argmax)
    rng = np.random.default_rng(0)
    K = rng.integers(-1, 2, (12, 2)).astype(np.float64)  # many duplicated keys
    Q = rng.integers(-1, 2, (9, 2)).astype(np.float64)
    Q[0] = 0.0  # every key ties
    S = Q @ K.T
    for k in (2, 5, 12):
        s, i = mips_topk(torch.tensor(Q), torch.tensor(K), k, batch_size=chunk)
        ref = np.argsort(-S, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(i.numpy(), ref)
        np.testing.assert_array_equal(s.numpy(), np.take_along_axis(S, ref, 1))
    exact = ExactMIPS(batch_size=chunk).fit(K)
    np.testing.assert_array_equal(exact.kneighbors(Q, 4, return_distance=False)[:, 0],
                                  exact.predict(Q))


def test_exact_mips_estimator_against_numpy(rng):
    K = rng.standard_normal((50, 7)).astype(np.float32)
    Q = rng.standard_normal((33, 7)).astype(np.float32)
    est = ExactMIPS(batch_size=8).fit(K)
    sims, idx = est.kneighbors(Q, n_neighbors=5)
    ref = Q @ K.T
    np.testing.assert_array_equal(idx, np.argsort(-ref, axis=1)[:, :5])
    np.testing.assert_allclose(sims, np.sort(ref, axis=1)[:, ::-1][:, :5], rtol=1e-5)
    assert np.all(np.diff(sims, axis=1) <= 0)
    np.testing.assert_array_equal(est.predict(Q), ref.argmax(1))
    assert est.score(Q) == 1.0
    assert est.kneighbors(torch.from_numpy(Q), 2, return_distance=False).shape == (33, 2)


def test_exact_mips_errors(rng):
    K = rng.standard_normal((5, 3))
    est = ExactMIPS().fit(K)
    with pytest.raises(ValueError, match="n_neighbors"):
        est.kneighbors(K, n_neighbors=6)
    with pytest.raises(ValueError, match="features"):
        est.predict(rng.standard_normal((2, 4)))
    with pytest.raises(ValueError, match="batch_size"):
        ExactMIPS(batch_size=0).fit(K)
    with pytest.raises(ValueError, match="NaN"):
        ExactMIPS().fit(np.array([[np.nan, 1.0]]))


def test_exact_mips_matches_faiss(rng):
    faiss = pytest.importorskip("faiss")
    K = rng.standard_normal((500, 16)).astype(np.float32)
    Q = rng.standard_normal((64, 16)).astype(np.float32)
    index = faiss.IndexFlatIP(16)
    index.add(K)
    fs, fi = index.search(Q, 10)
    s, i = ExactMIPS().fit(K).kneighbors(Q, 10)
    np.testing.assert_array_equal(i, fi)
    np.testing.assert_allclose(s, fs, rtol=1e-4, atol=1e-5)


# -- metrics -------------------------------------------------------------------
def _np_metrics(true, ranked, k):
    hits = ranked == true[:, None]
    first = np.where(hits.any(1), hits.argmax(1) + 1, np.inf)
    return (hits[:, 0].mean(), hits[:, :k].any(1).mean(), np.mean(1.0 / first))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20), m=st.integers(1, 6), N=st.integers(2, 8), seed=st.integers(0, 999))
def test_metrics_match_numpy_reference(n, m, N, seed):
    rng = np.random.default_rng(seed)
    true = rng.integers(0, N, n)
    ranked = np.stack([rng.permutation(N)[:m] if m <= N else rng.integers(0, N, m)
                       for _ in range(n)])
    k = max(1, m // 2)
    mr, rk, mrr = _np_metrics(true, ranked, k)
    assert match_rate(true, ranked) == pytest.approx(mr)
    assert match_rate(true, ranked[:, 0]) == pytest.approx(mr)
    assert recall_at_k(true, ranked, k) == pytest.approx(rk)
    assert mean_reciprocal_rank(true, ranked) == pytest.approx(mrr)


def test_metrics_tie_aware():
    K = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0], [-1.0, 0.0]])
    Q = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    true = np.array([0, 0, 2])
    pred = np.array([[1, 3], [3, 0], [3, 2]])  # key 1 ties with key 0 for the first query
    assert match_rate(true, pred) == pytest.approx(0.0)
    assert match_rate(true, pred, queries=Q, database=K) == pytest.approx(1 / 3)
    assert recall_at_k(true, pred, 2, queries=Q, database=K) == pytest.approx(1.0)
    assert mean_reciprocal_rank(true, pred, queries=Q, database=K) == pytest.approx(
        (1 + 0.5 + 0.5) / 3)
    with pytest.raises(ValueError, match="together"):
        match_rate(true, pred, queries=Q)
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k(true, pred, 3)


@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 1e6])
def test_tie_aware_metrics_do_not_depend_on_the_scale_of_the_data(scale):
    # regression: the tolerance had an absolute "+ 1", so on small-norm data every key
    # counted as tied with the maximum and random predictions scored 1.0
    rng = np.random.default_rng(0)
    K, Q = rng.standard_normal((30, 3)), rng.standard_normal((200, 3))
    true = (Q @ K.T).argmax(1)
    pred = np.stack([true, (true + 1) % 30], 1)
    kw = dict(queries=Q * scale, database=K * scale)
    assert match_rate(None, pred, **kw) == 1.0
    assert match_rate(None, pred[:, ::-1], **kw) == 0.0
    assert recall_at_k(None, pred[:, ::-1], 1, **kw) == 0.0
    assert mean_reciprocal_rank(None, pred[:, ::-1], **kw) == pytest.approx(0.5)
    assert ExactMIPS().fit(K * scale).score(Q * scale) == 1.0


def test_loss_and_schedule():
    s = torch.tensor([1.0, 2.0])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    total, sl, kl = amips_loss(s, k, s, k)
    assert total.item() == sl.item() == kl.item() == 0.0
    total, sl, kl = amips_loss(s + 1, k + 2, s, k, score_weight=0.5, target_weight=2.0)
    assert (sl.item(), kl.item(), total.item()) == (1.0, 4.0, 8.5)
    lrs = [warmup_cosine_lr(t, 100, 1.0, 10, 0.1) for t in range(101)]
    assert lrs[0] == 0.0 and lrs[10] == pytest.approx(1.0) and lrs[100] == pytest.approx(0.1)
    assert np.all(np.diff(lrs[:11]) > 0) and np.all(np.diff(lrs[10:]) <= 1e-12)


def test_rank_by_key_rejects_unknown_metric():
    q, keys = torch.randn(4, 3), torch.randn(10, 3)
    with pytest.raises(ValueError, match="metric"):
        rank_by_key(q, keys, 3, metric="L2")


def test_metrics_reject_invalid_predictions():
    """Out-of-range, negative (silently wrapped before) and fractional indices are errors."""
    rng = np.random.default_rng(0)
    K, Q = rng.standard_normal((10, 3)), rng.standard_normal((5, 3))
    truth = (Q @ K.T).argmax(1)
    for bad in (truth + 10, np.full(5, -1)):
        with pytest.raises(ValueError, match="outside"):
            match_rate(None, bad, queries=Q, database=K)
    with pytest.raises(TypeError, match="integer"):
        recall_at_k(truth, truth[:, None] + 0.5, 1)
    with pytest.raises(ValueError, match="empty"):
        mean_reciprocal_rank(truth[:0], truth[:0, None])
    assert match_rate(truth, truth.astype(np.float64)) == 1.0  # integral floats are fine


def test_tie_tolerance_is_not_widened_by_one_large_key():
    """The tolerance used ``max_j ||k_j||`` over the whole database, so one huge key
    made near-misses of every other query count as hits."""
    q = np.array([[1.0, 0.0]])
    db = np.array([[1.0, 0.0], [0.5, 0.0], [-1e6, 0.0]])
    assert match_rate(None, [1], queries=q, database=db) == 0.0
    assert match_rate(None, [0], queries=q, database=db) == 1.0
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((2000, 8))
    queries = rng.standard_normal((300, 8))
    second = np.argsort(-(queries @ keys.T), axis=1)[:, 1]
    keys[np.setdiff1d(np.arange(2000), second)[0]] *= 3000  # one far key, never predicted
    second = np.argsort(-(queries @ keys.T), axis=1)[:, 1]
    assert match_rate(None, second, queries=queries, database=keys) == 0.0


def test_score_searches_in_chunks_of_the_estimators_batch_size(monkeypatch, rng):
    """The tie-aware exact search of score() used the metrics' default chunk of 8192
    queries in float64 whatever batch_size / search_batch_size said (2.5 GB for 8192
    queries over 40k keys with batch_size=64)."""
    import mlpapers.retrieval.amips._kernels as kernels
    from mlpapers.retrieval import AmortizedMIPS

    seen = []
    topk = kernels._mips_topk

    def spy(queries, keys, k, batch_size, stats):
        seen.append(batch_size)
        return topk(queries, keys, k, batch_size, stats)

    monkeypatch.setattr(kernels, "_mips_topk", spy)
    keys, Q = rng.standard_normal((30, 3)), rng.standard_normal((20, 3))
    assert ExactMIPS(batch_size=7).fit(keys).score(Q) == 1.0
    assert seen and set(seen) == {7}
    model = AmortizedMIPS(depth=1, hidden_dim=8, n_steps=1, batch_size=8,
                          search_batch_size=5, random_state=0).fit(keys)
    seen.clear()
    rate = model.score(Q)
    assert seen and set(seen) == {5}
    # the chunking does not change the metrics
    pred = model.kneighbors(Q, 4, return_distance=False)
    for metric in (match_rate, mean_reciprocal_rank):
        assert metric(None, pred, queries=Q, database=keys, batch_size=3) == metric(
            None, pred, queries=Q, database=keys)
    assert recall_at_k(None, pred, 4, queries=Q, database=keys, batch_size=1) == recall_at_k(
        None, pred, 4, queries=Q, database=keys)
    assert rate == match_rate(None, pred[:, 0], queries=Q, database=keys)


def test_metrics_check_batch_size_in_both_modes():
    # batch_size was only checked when the tie-aware search ran
    for bad, err in ((-5, ValueError), (0, ValueError), (2.5, TypeError)):
        with pytest.raises(err, match="batch_size"):
            match_rate([0, 1], [0, 1], batch_size=bad)


@pytest.mark.parametrize("b, d", [(0, 3), (2, 0)])
def test_amips_loss_refuses_an_empty_batch_or_no_features(b, d):
    s, k = torch.zeros(b), torch.zeros(b, d)
    with pytest.raises(ValueError, match=rf"at least one query and one feature, got pred_key "
                                         rf"of shape \({b}, {d}\)"):
        amips_loss(s, k, s, k)
