"""Tests that kill mutants the rest of the suite let through (RBE).

Each test asserts a property against an independent reference: closed forms written
with numpy (pseudo-inverses, means and standard deviations), scikit-learn's k-means
with the documented selection rule applied by hand, the documented defaults, and the
losses of the neural head recomputed from their definitions.
"""

import copy

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans

from mlpapers.retrieval.rbe import (
    RelevanceBasedRetriever,
    cur_query_weights,
    fit_linear_embeddings,
    select_support,
)


def _t(a):
    return torch.as_tensor(a, dtype=torch.float64)


def test_linear_embeddings_standardise_by_default():
    rng = np.random.default_rng(0)
    R = rng.standard_normal((40, 15)) * rng.uniform(0.5, 3, 15) + rng.uniform(-4, 4, 15)
    S = [2, 5, 11]
    out = fit_linear_embeddings(_t(R[:, S]), _t(R))
    np.testing.assert_allclose(out["offsets"].numpy(), R.mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(out["mean"].numpy(), R[:, S].mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(out["scale"].numpy(), R[:, S].std(axis=0), atol=1e-12)


def test_cur_query_weights_drop_the_null_space_of_duplicated_anchors():
    # every query has an anchor item twice: the Gram matrix is singular, and the weights
    # must be the minimum-norm least-squares ones, u^T pinv(A_I) (no blow-up along the
    # rounding-level eigenvalue of the null direction)
    rng = np.random.default_rng(1)
    A = rng.standard_normal((20, 30))
    b, m = 12, 5
    I = np.stack([rng.choice(30, m - 1, replace=False) for _ in range(b)])
    I = np.hstack([I, I[:, :1]])  # the first anchor again
    u = rng.standard_normal((b, m))
    w = cur_query_weights(_t(A.T[I]), _t(u)).numpy()
    ref = np.stack([u[q] @ np.linalg.pinv(A[:, I[q]]) for q in range(b)])
    np.testing.assert_allclose(w, ref, atol=1e-8)


class _FixedKMeans:
    """A stand-in for sklearn's KMeans with a given clustering."""

    labels = centres = None

    def __init__(self, n_clusters, **kwargs):
        self.n_clusters = n_clusters

    def fit(self, X):
        self.labels_ = np.asarray(self.labels)
        self.cluster_centers_ = np.asarray(self.centres, dtype=np.float64)
        return self


def test_kmeans_picks_the_nearest_member_not_the_nearest_item(monkeypatch):
    import sklearn.cluster

    # 1-D items 0, 10, 4, 20, 21; clusters {0, 10, 21} (centre 4.9) and {4, 20} (centre 13)
    R = np.array([[0.0, 10.0, 4.0, 20.0, 21.0]])
    monkeypatch.setattr(_FixedKMeans, "labels", [0, 0, 1, 1, 0])
    monkeypatch.setattr(_FixedKMeans, "centres", [[4.9], [13.0]])
    monkeypatch.setattr(sklearn.cluster, "KMeans", _FixedKMeans)
    S, sizes = select_support(R, 2, "kmeans", center=False, random_state=0,
                              return_scores=True)
    # largest cluster first; item 2 (4.0) is nearer 4.9 but belongs to the other cluster
    assert S.tolist() == [0, 3]
    assert sizes.tolist() == [3.0, 2.0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_kmeans_selection_matches_sklearn_with_three_restarts(seed, monkeypatch):
    # the k-means actually run (recorded): 3 restarts by default, largest cluster
    # first, each pick the nearest member of its cluster
    import sklearn.cluster

    runs = []

    class RecordingKMeans(KMeans):
        def fit(self, X, y=None, sample_weight=None):
            runs.append((self, np.asarray(X, dtype=np.float64)))
            return super().fit(X, y, sample_weight=sample_weight)

    monkeypatch.setattr(sklearn.cluster, "KMeans", RecordingKMeans)
    R = np.random.default_rng(seed).standard_normal((6, 40))
    k = 12
    S, sizes = select_support(R, k, "kmeans", center=False,
                              random_state=np.random.default_rng(seed), return_scores=True)
    assert len(runs) == 1
    km, X = runs[0]
    assert km.n_init == 3 and km.n_clusters == k  # documented default
    d = ((km.cluster_centers_[:, None, :] - X[None]) ** 2).sum(-1)
    count = np.bincount(km.labels_, minlength=k)
    order = np.argsort(-count, kind="stable")
    np.testing.assert_array_equal(sizes, count[order])
    for c, j in zip(order, S):
        members = np.flatnonzero(km.labels_ == c)
        assert j in members and d[c, j] <= d[c, members].min() + 1e-9  # (ties: 2 members)


def _head_problem(n_val=0, seed=0):
    from mlpapers.retrieval.rbe._heads import build_head

    rng = np.random.default_rng(seed)
    R = _t(rng.standard_normal((40 + n_val, 6)) @ rng.standard_normal((6, 50)))
    R_fit, R_val = R[:40], R[40:]
    S = [1, 7, 20, 33]
    lin = fit_linear_embeddings(R_fit[:, S], R_fit)

    def u(Rs):
        return ((Rs[:, S] - lin["mean"]) / lin["scale"]).float()

    head = build_head(lin["embeddings"], lin["offsets"], R_fit.mean(dim=0), u(R_fit), 8,
                      seed=0, device=torch.device("cpu"))
    return head, u(R_fit), R_fit.float(), u(R_val), R_val


@pytest.mark.parametrize("loss", ["softmax_signed", "mse"])
def test_head_training_loss_is_the_chosen_loss(loss):
    from mlpapers.retrieval.rbe._heads import train_head

    head, U, T, U_val, R_val = _head_problem()
    before = copy.deepcopy(head)
    seen, forward = [], head.forward
    head.forward = lambda u, cols: seen.append(cols.clone()) or forward(u, cols)
    history, _ = train_head(head, U, T, U_val, R_val, loss=loss, top_quantile=0.9,
                            item_batch=16, max_iter=1, generator=torch.Generator().manual_seed(3))
    cols = seen[0]  # the item columns sampled for the first step
    assert cols.shape == (16,)
    with torch.no_grad():
        logits, target = before(U, cols), T[:, cols]
        if loss == "mse":
            expected = ((logits - target) ** 2).mean()
        else:
            thr = torch.quantile(target, 0.9, dim=1, keepdim=True)
            sign = torch.where(target >= thr, 1.0, -1.0)
            expected = -(sign * torch.softmax(logits, dim=1)).mean()
    assert history[0]["loss"] == pytest.approx(float(expected), rel=1e-5, abs=1e-7)


def test_head_is_validated_every_eval_every_steps_and_at_the_last():
    from mlpapers.retrieval.rbe._heads import train_head

    head, U, T, U_val, R_val = _head_problem(n_val=10)
    history, best = train_head(head, U, T, U_val, R_val, max_iter=7, eval_every=3,
                               item_batch=8, generator=torch.Generator().manual_seed(0))
    assert [h["step"] for h in history if "val_hit_rate" in h] == [3, 6, 7]
    assert best >= max(h["val_hit_rate"] for h in history if "val_hit_rate" in h)


def test_mlp_head_fits_two_queries_with_a_validation_fraction_of_nine_tenths():
    rng = np.random.default_rng(0)
    Q, I = rng.standard_normal((2, 3)), rng.standard_normal((12, 3))
    R = Q @ I.T
    est = RelevanceBasedRetriever(lambda q, i: np.asarray(q) @ np.asarray(i).T, n_support=2,
                                  support="popular", head="mlp", validation_fraction=0.9,
                                  max_iter=2, mlp_hidden=4, random_state=0)
    est.fit(Q, I, relevance_matrix=R)  # one query for validation, one to fit
    assert np.isfinite(est.predict(Q)).all()
    assert np.isfinite(est.item_embeddings_).all()


def _lowrank(n_q=40, n_i=30, rank=3, seed=0):
    rng = np.random.default_rng(seed)
    Q, I = rng.standard_normal((n_q, rank)), rng.standard_normal((n_i, rank))
    return Q, I, (lambda q, i: np.tanh(np.asarray(q) @ np.asarray(i).T))


def test_predict_in_chunks_equals_one_chunk():
    Q, I, f = _lowrank()
    est = RelevanceBasedRetriever(f, n_support=5, batch_size=1024).fit(Q[:30], I)
    full = est.predict(Q[30:])
    est.set_params(batch_size=3)  # 10 queries: chunks of 3, 3, 3, 1
    chunked = est.predict(Q[30:])
    assert chunked.shape == (10, 30)
    np.testing.assert_allclose(chunked, full, rtol=1e-12, atol=1e-12)


def test_score_is_the_hit_rate_at_ten_by_default():
    from mlpapers.retrieval.rbe import hit_rate

    Q, I, f = _lowrank(rank=6)
    est = RelevanceBasedRetriever(f, n_support=4, support="random", random_state=0)
    est.fit(Q[:30], I)
    truth = f(Q[30:], I)
    idx = est.kneighbors(Q[30:], 10, return_distance=False)
    assert est.score(Q[30:], truth) == hit_rate(truth, idx, 10)
    assert est.score(Q[30:]) == hit_rate(truth, idx, 10)  # the heavy ranker as truth


def test_adacur_fills_a_short_greedy_first_round_with_distinct_items():
    import warnings

    from mlpapers.retrieval.rbe import AdaCURRetriever

    rng = np.random.default_rng(0)
    Q, I = rng.standard_normal((40, 2)), rng.standard_normal((30, 2))

    def f(q, i):  # rank 2: greedy stops after 2 items
        return np.asarray(q) @ np.asarray(i).T

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the early stop is handled, not reported
        est = AdaCURRetriever(f, n_calls=26, n_rounds=2, init="greedy",
                              random_state=0).fit(Q, I)
    first = est.initial_anchors_
    assert len(first) == 13 and len(set(first.tolist())) == 13
    assert ((first >= 0) & (first < 30)).all()


@pytest.mark.parametrize("support", ["greedy", "popular", "kmeans"])
def test_supports_are_selected_without_the_held_out_queries(monkeypatch, support):
    # the held-out queries pick the neural head's checkpoint: supports selected on them
    # would make that validation hit rate optimistic (the note's leakage pitfall)
    import mlpapers.retrieval.rbe._estimator as mod

    seen = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen[name] = args[1] if name == "linear" else args[0]
            return fn(*args, **kwargs)
        monkeypatch.setattr(mod, fn.__name__, wrapped)

    spy("select", mod.select_support)
    spy("linear", mod._fit_linear_embeddings)
    Q, I, f = _lowrank(n_q=40, n_i=30, rank=6)
    R = f(Q, I)
    est = RelevanceBasedRetriever(f, n_support=4, support=support, head="mlp", max_iter=2,
                                  mlp_hidden=4, validation_fraction=0.25, random_state=0)
    est.fit(Q, I, relevance_matrix=R)
    rows = seen["select"].numpy()
    assert rows.shape == (30, 30)  # 10 of the 40 queries held out
    np.testing.assert_array_equal(rows, seen["linear"].numpy())
    held_out = np.ones(40, bool)
    held_out[[int(np.flatnonzero((R == r).all(axis=1))[0]) for r in rows]] = False
    assert held_out.sum() == 10
    expected = select_support(R[~held_out], 4, support, random_state=0)
    if support != "kmeans":  # k-means draws from the estimator's generator after the split
        np.testing.assert_array_equal(est.support_indices_, expected)
