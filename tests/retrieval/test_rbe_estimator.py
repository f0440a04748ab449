"""RelevanceBasedRetriever / AnnCURRetriever: call accounting, exactness, claim, errors."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from mlpapers.datasets._relevance import make_relevance_problem
from mlpapers.retrieval.rbe import AnnCURRetriever, RelevanceBasedRetriever, hit_rate

from ._counting import CatStorageSpy, CountingRelevance


def _bilinear(rank=4, n_q=60, n_i=40, seed=0):
    rng = np.random.default_rng(seed)
    Q, I = rng.standard_normal((n_q, rank)), rng.standard_normal((n_i, rank))
    return Q, I, (lambda q, i: np.asarray(q) @ np.asarray(i).T)


@pytest.fixture(scope="module")
def problem():
    Q, I, f = make_relevance_problem(260, 150, random_state=0)
    return Q, I, f, f(Q, I)


def test_heavy_call_accounting(problem):
    Q, I, f, _ = problem
    heavy = CountingRelevance(f)
    est = RelevanceBasedRetriever(heavy, n_support=12, batch_size=64).fit(Q[:200], I)
    assert heavy.pairs == 200 * 150 == est.n_heavy_calls_
    heavy.pairs = 0
    U = est.transform_queries(Q[200:])
    assert U.shape == (60, 12) and heavy.pairs == 60 * 12  # exactly k calls per query
    heavy.pairs = 0
    est.predict(Q[200:210])
    assert heavy.pairs == 10 * 12
    est.set_params(n_rerank=20)
    est.fit(Q[:200], I, relevance_matrix=f(Q[:200], I))
    assert est.n_heavy_calls_ == 0 and est.n_calls_per_query_ == 32
    heavy.pairs = 0
    est.kneighbors(Q[200:], n_neighbors=5)
    assert heavy.pairs == 60 * (12 + 20)


def test_linear_predictions_equal_lstsq_reference(problem):
    Q, I, f, R = problem
    for standardize in (False, True):
        est = RelevanceBasedRetriever(f, n_support=10, standardize=standardize)
        est.fit(Q[:200], I, relevance_matrix=R[:200])
        S = est.support_indices_
        A = R[:200, S]
        Aq = R[200:, S]
        if standardize:
            A, Aq = np.hstack([A, np.ones((200, 1))]), np.hstack([Aq, np.ones((60, 1))])
        coef, *_ = np.linalg.lstsq(A, R[:200], rcond=None)
        np.testing.assert_allclose(est.predict(Q[200:]), Aq @ coef, atol=1e-8)
        assert est.transform_items().shape == (150, 10)


def test_low_rank_relevance_is_retrieved_exactly():
    Q, I, f = _bilinear(rank=4)
    with pytest.warns(UserWarning, match="stopped after"):
        est = RelevanceBasedRetriever(f, n_support=10, standardize=False).fit(Q[:40], I)
    assert len(est.support_indices_) == 4 and est.n_calls_per_query_ == 4
    R_te = f(Q[40:], I)
    np.testing.assert_allclose(est.predict(Q[40:]), R_te, atol=1e-8)
    scores, idx = est.kneighbors(Q[40:], n_neighbors=5)
    assert hit_rate(R_te, idx) == 1.0
    np.testing.assert_allclose(scores, np.take_along_axis(R_te, idx, 1), atol=1e-8)


def test_retrieval_recall_and_rerank(problem):
    Q, I, f, R = problem
    est = RelevanceBasedRetriever(f, n_support=20).fit(Q[:200], I, relevance_matrix=R[:200])
    base = est.score(Q[200:], R[200:], n_neighbors=10)
    assert 0.5 < base <= 1.0
    est.set_params(n_rerank=40).fit(Q[:200], I, relevance_matrix=R[:200])
    scores, idx = est.kneighbors(Q[200:], n_neighbors=10)
    np.testing.assert_allclose(scores, np.take_along_axis(R[200:], idx, 1))  # heavy scores
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert hit_rate(R[200:], idx) >= base
    est.set_params(n_rerank=150).fit(Q[:200], I, relevance_matrix=R[:200])
    assert est.score(Q[200:], R[200:], n_neighbors=10) == 1.0  # re-rank everything = exact


def test_invariance_to_positive_scaling_and_item_permutation(problem):
    Q, I, f, R = problem
    est = RelevanceBasedRetriever(f, n_support=8).fit(Q[:200], I, relevance_matrix=R[:200])
    idx = est.kneighbors(Q[200:], 10, return_distance=False)
    scaled = RelevanceBasedRetriever(lambda q, i: 3.0 * f(q, i), n_support=8)
    scaled.fit(Q[:200], I, relevance_matrix=3.0 * R[:200])
    np.testing.assert_array_equal(scaled.support_indices_, est.support_indices_)
    np.testing.assert_array_equal(scaled.kneighbors(Q[200:], 10, return_distance=False), idx)
    perm = np.random.default_rng(0).permutation(150)
    pe = RelevanceBasedRetriever(f, n_support=8).fit(Q[:200], I[perm],
                                                     relevance_matrix=R[:200, perm])
    np.testing.assert_array_equal(perm[pe.support_indices_], est.support_indices_)
    np.testing.assert_allclose(pe.predict(Q[200:]), est.predict(Q[200:])[:, perm], atol=1e-9)
    qperm = np.random.default_rng(1).permutation(200)
    qe = RelevanceBasedRetriever(f, n_support=8).fit(Q[qperm], I, relevance_matrix=R[qperm])
    np.testing.assert_allclose(qe.item_embeddings_, est.item_embeddings_, atol=1e-9)


def test_anncur_is_rbe_with_random_supports(problem):
    Q, I, f, R = problem
    cur = AnnCURRetriever(f, n_support=10, random_state=3).fit(Q[:200], I, relevance_matrix=R[:200])
    rbe = RelevanceBasedRetriever(f, n_support=10, support="random", standardize=False,
                                  random_state=3).fit(Q[:200], I, relevance_matrix=R[:200])
    np.testing.assert_array_equal(cur.support_indices_, rbe.support_indices_)
    np.testing.assert_allclose(cur.item_embeddings_, rbe.item_embeddings_)
    assert "support" not in cur.get_params() and clone(cur).n_support == 10


def test_explicit_support_and_strings():
    items = [f"item{j}" for j in range(12)]
    queries = [f"q{j}" for j in range(20)]
    table = np.random.default_rng(0).standard_normal((20, 3)) @ np.random.default_rng(
        1).standard_normal((3, 12))

    def heavy(qs, its):
        return table[np.ix_([int(q[1:]) for q in qs], [int(i[4:]) for i in its])]

    est = RelevanceBasedRetriever(heavy, support=[0, 5, 7], standardize=False).fit(queries, items)
    assert est.support_items_ == ["item0", "item5", "item7"]
    assert est.kneighbors(["q3"], 2, return_distance=False).shape == (1, 2)
    # a lone query string is not iterated letter by letter into relevance_fn
    for call in (lambda: est.kneighbors("q3", 2), lambda: est.transform_queries("q3"),
                 lambda: est.fit("q3", items), lambda: clone(est).fit(queries, "item0")):
        with pytest.raises(TypeError, match=r"got a single str; wrap a single element"):
            call()


def test_determinism(problem):
    Q, I, f, R = problem
    for support in ("random", "kmeans"):
        a = RelevanceBasedRetriever(f, n_support=6, support=support, random_state=7)
        b = clone(a)
        a.fit(Q[:200], I, relevance_matrix=R[:200])
        b.fit(Q[:200], I, relevance_matrix=R[:200])
        np.testing.assert_array_equal(a.support_indices_, b.support_indices_)
    kw = dict(n_support=6, head="mlp", mlp_hidden=8, max_iter=20, eval_every=10,
              random_state=0)
    state = torch.get_rng_state()
    a = RelevanceBasedRetriever(f, **kw).fit(Q[:200], I, relevance_matrix=R[:200])
    assert torch.equal(state, torch.get_rng_state())  # global RNG untouched
    b = RelevanceBasedRetriever(f, **kw).fit(Q[:200], I, relevance_matrix=R[:200])
    np.testing.assert_array_equal(a.predict(Q[200:]), b.predict(Q[200:]))


def test_small_scale_claim_greedy_and_kmeans_beat_random():
    """Paper's ablation in small: informed supports beat AnnCUR's random ones."""
    Q, I, f = make_relevance_problem(700, 600, random_state=0)
    R = f(Q, I)
    fit = dict(relevance_matrix=R[:500])
    rand = np.mean([
        AnnCURRetriever(f, n_support=10, random_state=s).fit(Q[:500], I, **fit)
        .score(Q[500:], R[500:], n_neighbors=10) for s in range(5)])
    # margins: about half the paper's ablation (greedy +0.088, k-means +0.042 over random);
    # over 15 other data seeds the measured margins were >= 0.058 and >= 0.028 (k-means
    # missed a +0.05 margin on 6 of them)
    for support, margin in (("greedy", 0.04), ("kmeans", 0.02)):
        est = RelevanceBasedRetriever(f, n_support=10, support=support, random_state=0)
        assert est.fit(Q[:500], I, **fit).score(Q[500:], R[500:], 10) > rand + margin


def test_mlp_head_reduces_to_linear_when_untrained(problem):
    Q, I, f, R = problem
    lin = RelevanceBasedRetriever(f, n_support=8).fit(Q[:200], I, relevance_matrix=R[:200])
    for hidden in (0, 16):
        mlp = RelevanceBasedRetriever(f, n_support=8, head="mlp", mlp_hidden=hidden,
                                      max_iter=0, validation_fraction=0.0, random_state=0)
        mlp.fit(Q[:200], I, relevance_matrix=R[:200])
        np.testing.assert_allclose(mlp.predict(Q[200:]), lin.predict(Q[200:]), atol=1e-4)


def test_mlp_head_trains_and_never_validates_worse(problem):
    Q, I, f, R = problem
    est = RelevanceBasedRetriever(f, n_support=8, head="mlp", mlp_hidden=32, max_iter=150,
                                  lr=3e-3, eval_every=50, random_state=0)
    est.fit(Q[:200], I, relevance_matrix=R[:200])
    losses = [h["loss"] for h in est.history_]
    assert np.mean(losses[-30:]) < np.mean(losses[:30])
    vals = [h["val_hit_rate"] for h in est.history_ if "val_hit_rate" in h]
    assert est.best_validation_hit_rate_ >= max(vals) - 1e-12
    mse = clone(est).set_params(loss="mse", max_iter=30).fit(Q[:200], I,
                                                              relevance_matrix=R[:200])
    assert np.isfinite(mse.predict(Q[200:])).all()


@pytest.mark.parametrize("head", ["linear", "mlp"])
def test_save_load_round_trip(tmp_path, problem, head):
    Q, I, f, R = problem
    est = RelevanceBasedRetriever(f, n_support=6, head=head, mlp_hidden=8, max_iter=20,
                                  eval_every=10, random_state=0)
    est.fit(Q[:200], I, relevance_matrix=R[:200])
    path = tmp_path / "rbe.pt"
    est.save(path)
    assert est.relevance_fn is f
    with pytest.raises(TypeError, match="relevance_fn"):
        RelevanceBasedRetriever.load(path)
    with pytest.raises(TypeError, match="items"):
        RelevanceBasedRetriever.load(path, relevance_fn=f)
    with pytest.raises(ValueError, match="items has"):
        RelevanceBasedRetriever.load(path, relevance_fn=f, items=I[:10])
    back = RelevanceBasedRetriever.load(path, relevance_fn=f, items=I)
    np.testing.assert_array_equal(back.predict(Q[200:]), est.predict(Q[200:]))
    np.testing.assert_array_equal(back.support_indices_, est.support_indices_)


def test_bad_input(problem):
    Q, I, f, R = problem
    with pytest.raises(ValueError, match="n_support=151"):
        RelevanceBasedRetriever(f, n_support=151).fit(Q[:20], I)
    with pytest.raises(ValueError, match="support must be one of"):
        RelevanceBasedRetriever(f, support="best").fit(Q[:20], I)
    with pytest.raises(ValueError, match="head must be one of"):
        RelevanceBasedRetriever(f, n_support=3, head="deep").fit(Q[:20], I)
    with pytest.raises(TypeError, match="relevance_fn must be a callable"):
        RelevanceBasedRetriever(None, n_support=3).fit(Q[:20], I)
    with pytest.raises(ValueError, match="returned shape"):
        RelevanceBasedRetriever(lambda q, i: f(q, i)[:, :-1], n_support=3).fit(Q[:20], I)
    with pytest.raises(ValueError, match="NaN or infinite"):
        RelevanceBasedRetriever(lambda q, i: f(q, i) * np.nan, n_support=3).fit(Q[:20], I)
    with pytest.raises(ValueError, match="relevance_matrix must have shape"):
        RelevanceBasedRetriever(f, n_support=3).fit(Q[:20], I, relevance_matrix=R[:10])
    with pytest.raises(ValueError, match="NaN"):
        RelevanceBasedRetriever(f, n_support=3).fit(Q[:2], I[:3],
                                                    relevance_matrix=np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="support indices"):
        RelevanceBasedRetriever(f, support=[0, 0, 1]).fit(Q[:20], I)
    with pytest.raises(ValueError, match="items is empty"):
        RelevanceBasedRetriever(f, n_support=3).fit(Q[:20], I[:0])
    with pytest.raises(NotFittedError):
        RelevanceBasedRetriever(f).predict(Q[:3])
    est = RelevanceBasedRetriever(f, n_support=3, n_rerank=5)
    est.fit(Q[:20], I, relevance_matrix=R[:20])
    with pytest.raises(ValueError, match="n_rerank=5"):
        est.kneighbors(Q[:2], n_neighbors=6)
    with pytest.raises(ValueError, match="n_neighbors=151"):
        est.kneighbors(Q[:2], n_neighbors=151)
    est.relevance_fn = lambda q, i: np.zeros((len(q) + 1, len(i)))
    with pytest.raises(ValueError, match="returned shape"):
        est.transform_queries(Q[:2])


def test_excluded_from_sklearn_fit_xy_checks():
    assert RelevanceBasedRetriever._estimator_check_instances() == []
    assert AnnCURRetriever._estimator_check_instances() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RelevanceBasedRetriever().get_params()["n_support"] == 100


# -- audit regressions: inputs made elsewhere -------------------------------------
def test_pandas_items_and_queries_are_indexed_by_position():
    """A DataFrame catalogue is indexed by row position (``df[i]`` is a column lookup)."""
    pd = pytest.importorskip("pandas")
    from mlpapers.retrieval.rbe import AdaCURRetriever

    Q, I, f = _bilinear()
    # a non-default row index: positional and label lookups differ
    Qd = pd.DataFrame(Q, index=np.arange(len(Q)) * 7 + 3)
    Id = pd.DataFrame(I, index=np.arange(len(I)) * 5 + 1)
    fd = lambda q, i: f(q.to_numpy(), i.to_numpy())  # noqa: E731
    for est, plain in [
        (RelevanceBasedRetriever(fd, n_support=6, n_rerank=8, batch_size=16),
         RelevanceBasedRetriever(f, n_support=6, n_rerank=8, batch_size=16)),
        (AdaCURRetriever(fd, n_calls=6, n_rounds=2, random_state=0),
         AdaCURRetriever(f, n_calls=6, n_rounds=2, random_state=0)),
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = est.fit(Qd.iloc[:50], Id).kneighbors(Qd.iloc[50:], 4)
            ref = plain.fit(Q[:50], I).kneighbors(Q[50:], 4)
        np.testing.assert_array_equal(got[1], ref[1])
        np.testing.assert_allclose(got[0], ref[0])


def test_complex_or_non_numeric_heavy_scores_are_rejected():
    Q, I, f = _bilinear()
    with pytest.raises(TypeError, match="complex"):
        RelevanceBasedRetriever(lambda q, i: f(q, i) + 0j, n_support=3).fit(Q, I)
    with pytest.raises(TypeError, match="real numeric array"):
        RelevanceBasedRetriever(lambda q, i: None, n_support=3).fit(Q, I)


@pytest.mark.parametrize("params", [dict(top_quantile="high"), dict(validation_fraction=None),
                                    dict(top_quantile=1.0), dict(validation_fraction=-0.1)])
def test_head_fraction_params_named_in_errors(params):
    Q, I, f = _bilinear()
    with pytest.raises(ValueError, match=next(iter(params))):
        RelevanceBasedRetriever(f, n_support=3, head="mlp", **params).fit(Q, I)


def test_hit_rate_counts_a_repeated_item_once_and_checks_indices():
    R = np.random.default_rng(0).standard_normal((4, 10))
    best = np.argsort(-R, axis=1)
    assert hit_rate(R, best[:, :3]) == 1.0
    # the true top-1 repeated three times is one hit of three, not three
    assert hit_rate(R, np.repeat(best[:, :1], 3, axis=1)) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="outside"):
        hit_rate(R, np.full((4, 3), 10))
    with pytest.raises(ValueError, match="outside"):
        hit_rate(R, np.full((4, 3), -1))
    with pytest.raises(TypeError, match="integer"):
        hit_rate(R, best[:, :3] + 0.5)
    for k in (2.5, True, "2"):  # (int(k) truncated 2.5 to 2 and read True as 1)
        with pytest.raises(TypeError, match="^k must be an integer"):
            hit_rate(R, best[:, :3], k)
    assert hit_rate(R, best[:, :3], np.int64(2)) == 1.0


def test_no_support_item_means_no_heavy_call_with_empty_items():
    """Constant training relevance: greedy picks nothing; queries then cost no heavy call
    (``relevance_fn`` is never called with an empty item list) and items rank by mean."""
    Q, I, _ = _bilinear()
    calls = []

    def heavy(q, i):
        calls.append(len(i))
        assert len(i) > 0
        return np.tile(np.arange(len(i), dtype=float), (len(q), 1))  # item j scores j

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = RelevanceBasedRetriever(heavy, n_support=3).fit(list(Q[:20]), list(I))
    assert [str(w.message)[:38] for w in caught] == ["greedy support selection stopped after"]
    assert est.support_indices_.shape == (0,)
    calls.clear()
    idx = est.kneighbors(list(Q[20:25]), 3, return_distance=False)
    assert calls == [] and est.n_calls_per_query_ == 0
    np.testing.assert_array_equal(idx, np.tile([39, 38, 37], (5, 1)))


def test_n_rerank_set_after_fit_is_checked_at_inference():
    # regression: kneighbors reads n_rerank live, and a negative value set after fit
    # silently switched re-ranking off
    Q, I, f = _bilinear()
    est = RelevanceBasedRetriever(f, n_support=4, n_rerank=5).fit(Q[:50], I)
    with pytest.raises(ValueError, match="n_rerank"):
        est.set_params(n_rerank=-1).kneighbors(Q[50:], 3)


@pytest.mark.parametrize("cls", [RelevanceBasedRetriever, AnnCURRetriever])
def test_batch_size_set_after_fit_is_checked_by_every_heavy_call(cls):
    # regression: a negative batch_size made the chunk loop empty, and predict and
    # transform_queries returned an unfilled buffer as scores, different at every call
    Q, I, f = _bilinear()
    est = cls(f, n_support=4).fit(Q[:50], I)
    for bad, error in [(-1, ValueError), (0, ValueError), (2.5, TypeError), (None, TypeError)]:
        est.set_params(batch_size=bad)
        for call in (lambda: est.predict(Q[50:]), lambda: est.transform_queries(Q[50:]),
                     lambda: est.score(Q[50:], n_neighbors=3)):
            with pytest.raises(error, match="^batch_size must be"):
                call()


@pytest.mark.parametrize("head", ["linear", "mlp"])
def test_kneighbors_memory_does_not_grow_with_queries_times_items(monkeypatch, head):
    """Each query chunk keeps only its top ``n_neighbors`` (not a slice of the chunk's
    whole argsort, which held ``n_queries x n_items`` int64 until the end)."""
    rng = np.random.default_rng(0)
    n_q, N = 48, 400
    R = rng.standard_normal((30, N))
    R_te = rng.standard_normal((n_q, N))
    f = lambda q, i: R_te[np.ix_(np.asarray(q), np.asarray(i))]  # noqa: E731
    est = RelevanceBasedRetriever(f, n_support=5, support="random", head=head, max_iter=2,
                                  batch_size=4, random_state=0).fit(np.arange(30),
                                                                    np.arange(N), R)
    ref = est.set_params(batch_size=n_q).kneighbors(np.arange(n_q), 3)
    spy = CatStorageSpy(torch.cat)
    monkeypatch.setattr(torch, "cat", spy)
    got = est.set_params(batch_size=4).kneighbors(np.arange(n_q), 3)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6)
    assert spy.max_bytes < n_q * N * 8 / 4  # chunks of 4 queries: ~ 4 * N * 8 bytes


@pytest.mark.parametrize("head", ["linear", "mlp"])
def test_fit_checks_the_relevance_matrix_for_nan_once(problem, monkeypatch, head):
    """The linear solve checked the already validated training matrix again (a full
    pass over n_queries x n_items values): the fit was 1.5 times as slow."""
    from mlpapers._utils import _validation

    Q, I, f, R = problem
    full_size = []
    all_finite = _validation._all_finite

    def counting(t, *args, **kwargs):
        if t.numel() >= R.size:
            full_size.append(tuple(t.shape))
        return all_finite(t, *args, **kwargs)

    monkeypatch.setattr(_validation, "_all_finite", counting)
    # (given support indices: a selection method is a public function of its own)
    est = RelevanceBasedRetriever(f, n_support=12, support=np.arange(0, 120, 10), head=head,
                                  max_iter=2, random_state=0).fit(Q, I, relevance_matrix=R)
    assert full_size == [R.shape]
    # and the fit is the public kernel's, which checks its inputs itself
    from mlpapers.retrieval.rbe import fit_linear_embeddings

    if head == "linear":
        Rt = torch.as_tensor(R)
        lin = fit_linear_embeddings(Rt[:, est.support_indices_], Rt)
        np.testing.assert_array_equal(est.item_embeddings_, lin["embeddings"].numpy())
    with pytest.raises(ValueError, match="R contains NaN"):
        fit_linear_embeddings(torch.zeros(3, 1), torch.full((3, 2), float("nan")))


def test_n_rerank_set_after_fit_is_checked_against_the_items():
    rng = np.random.default_rng(0)
    Q, items = rng.standard_normal((300, 5)), rng.standard_normal((80, 5))
    heavy = lambda q, i: np.tanh(np.asarray(q) @ np.asarray(i).T)  # noqa: E731
    m = RelevanceBasedRetriever(heavy, n_support=8, random_state=0).fit(Q[:100], items)
    m.set_params(n_rerank=81)  # (80 items: fit refuses it; kneighbors clamped it)
    with pytest.raises(ValueError, match=r"n_rerank=81 must be <= the number of items \(80\)"):
        m.kneighbors(Q[100:101], 5)
    m.set_params(n_rerank=80)  # every item re-ranked: exact search
    idx = m.kneighbors(Q[100:103], 5, return_distance=False)
    np.testing.assert_array_equal(idx, np.argsort(-heavy(Q[100:103], items), axis=1)[:, :5])
