"""RBE code paths no other test reached (session 19 coverage audit), and the errors that
came after the heavy-ranker calls they were meant to spare."""

import warnings
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse
import torch

from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
    AnnCURRetriever,
    RelevanceBasedRetriever,
    greedy_selection,
    hit_rate,
    select_support,
)
from tests.retrieval._counting import CountingRelevance


def _tanh(q, i):
    return np.tanh(np.asarray(q) @ np.asarray(i).T)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((80, 4)), rng.standard_normal((40, 4))


# -- errors before any heavy call ------------------------------------------------
@pytest.mark.parametrize("support", [[0, 40], [3, 3], [[0, 1]], [], [0.0, 1.0]])
def test_explicit_support_is_refused_before_the_offline_heavy_calls(data, support):
    """An invalid explicit support array was detected after ``fit`` had scored every
    training query against every item (60 x 40 heavy calls here)."""
    Q, I = data
    f = CountingRelevance(_tanh)
    with pytest.raises(ValueError, match="support"):
        RelevanceBasedRetriever(f, support=support).fit(Q[:60], I)
    assert f.pairs == 0


@pytest.mark.parametrize("cls,kw", [(RelevanceBasedRetriever, dict(n_support=8)),
                                    (AdaCURRetriever, dict(n_calls=8, n_rounds=2))])
def test_score_checks_the_relevance_shape_before_the_online_heavy_calls(data, cls, kw):
    """A relevance of another catalogue (more columns) was scored without an error
    (a silent wrong HitRate), and one of fewer rows raised about ``pred_indices``, after
    kneighbors had spent its heavy calls. A relevance of the right shape gives
    ``hit_rate`` of the retrieved items."""
    Q, I = data
    f = CountingRelevance(_tanh)
    est = cls(f, random_state=0, **kw).fit(Q[:60], I)
    R = _tanh(Q[60:], I)
    f.pairs = 0
    for bad in (np.c_[R, np.full((20, 5), 10.0)], R[:10]):
        with pytest.raises(ValueError, match=r"relevance must have shape .* \(20, 40\)"):
            est.score(Q[60:], bad, n_neighbors=5)
    assert f.pairs == 0
    idx = est.kneighbors(Q[60:], 5, return_distance=False)
    assert est.score(Q[60:], R, n_neighbors=5) == hit_rate(R, idx, 5)


@pytest.mark.parametrize("bad,err,match", [
    ([[0.5] * 40] * 19 + [[0.5] * 39], ValueError, "relevance could not be converted"),
    (np.zeros(40), ValueError, r"relevance must be 2-D \(n_queries, n_items\), got shape \(40,\)"),
    (np.zeros((20, 40, 1)), ValueError, "relevance must be 2-D"),
    (np.full((20, 40), "a"), TypeError, "relevance must contain numbers"),
    (np.zeros((20, 40), dtype=complex), ValueError, "Complex data not supported: relevance"),
    (torch.zeros(20, 40, dtype=torch.complex64), ValueError, "Complex data not supported: rel"),
    (torch.zeros(20, 40).to_sparse(), TypeError, r"pass relevance\.to_dense\(\)"),
    (scipy.sparse.csr_matrix((20, 40)), TypeError, r"pass relevance\.toarray\(\)"),
    ({0: 1}, TypeError, "relevance must be an array-like.*got dict"),
    ("relevance", TypeError, "relevance must be an array-like.*got str"),
])
def test_score_refuses_a_relevance_without_a_2d_real_shape_before_heavy_calls(
        data, bad, err, match):
    """What has no 2-D shape, or is sparse or not real, is named before kneighbors'
    online heavy calls, with check_matrix's messages (the sparse ones say how to
    densify) for what is not a real numpy array or tensor."""
    Q, I = data
    f = CountingRelevance(_tanh)
    est = RelevanceBasedRetriever(f, n_support=8).fit(Q[:60], I)
    f.pairs = 0
    with pytest.raises(err, match=match):
        est.score(Q[60:], bad, n_neighbors=5)
    assert f.pairs == 0


def test_score_validates_the_relevance_values_once(data, monkeypatch):
    """``score`` ran check_matrix (a NaN/inf pass and a float64 copy, held while
    kneighbors ran) and hit_rate ran it again on the same matrix. Now, for a real numpy
    array, only hit_counts does, naming ``relevance`` (it named ``true_scores``); a NaN
    relevance is still refused by it, and a list of rows (converted up front) scores as
    the array."""
    import mlpapers.retrieval.rbe._common as common
    import mlpapers.retrieval.rbe._kernels as kernels

    Q, I = data
    est = RelevanceBasedRetriever(_tanh, n_support=8).fit(Q[:60], I)
    R = _tanh(Q[60:], I)
    seen = []

    def counting(check):
        def wrapper(M, name, *args, **kwargs):
            seen.append(name)
            return check(M, name, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(kernels, "check_matrix", counting(kernels.check_matrix))
    monkeypatch.setattr(common, "check_matrix", counting(common.check_matrix))
    value = est.score(Q[60:], R, n_neighbors=5)
    assert seen == ["relevance"]
    assert est.score(Q[60:], R.tolist(), n_neighbors=5) == value
    assert set(seen) == {"relevance"}
    R[3, 7] = np.nan
    with pytest.raises(ValueError, match="Input relevance contains NaN"):
        est.score(Q[60:], R, n_neighbors=5)


def _decimal(R):
    return np.vectorize(Decimal, otypes=[object])(R)


def _fraction(R):
    return np.vectorize(Fraction, otypes=[object])(R)


@pytest.fixture(scope="module")
def three_retrievers(data):
    Q, I = data
    return [RelevanceBasedRetriever(_tanh, n_support=8).fit(Q[:60], I),
            AdaCURRetriever(_tanh, n_calls=8, n_rounds=2, random_state=0).fit(Q[:60], I),
            AnnCURRetriever(_tanh, n_support=8, random_state=0).fit(Q[:60], I)]


@pytest.mark.parametrize("convert", [
    lambda R: R.astype(object), _decimal, _fraction,
    "nullable_to_numpy", "nullable_df",
], ids=["object", "decimal", "fraction", "nullable_to_numpy", "nullable_df"])
def test_score_accepts_relevance_that_check_matrix_converts(data, three_retrievers, convert):
    """The shape-only check of the previous release refused every array whose dtype is
    not a real number kind (object arrays of floats, Decimal or Fraction,
    ``.to_numpy()`` of a nullable pandas frame) with "must hold real numbers",
    which check_matrix had always converted. They score as the float array does.
    (String arrays, numeric or not, are refused everywhere, as scikit-learn does.)"""
    if isinstance(convert, str):  # (pandas is optional)
        pd = pytest.importorskip("pandas")
        convert = {"nullable_to_numpy": lambda R: pd.DataFrame(R).astype("Float64").to_numpy(),
                   "nullable_df": lambda R: pd.DataFrame(R).astype("Float64")}[convert]
    Q, I = data
    R = _tanh(Q[60:], I)
    for est in three_retrievers:
        assert est.score(Q[60:], convert(R), n_neighbors=5) == est.score(
            Q[60:], R, n_neighbors=5)


def test_score_refuses_string_relevance_as_check_array_does(data, three_retrievers):
    Q, I = data
    R = _tanh(Q[60:], I).astype(str)
    for est in three_retrievers:
        with pytest.raises(TypeError, match="must contain numbers, got an array of dtype <U"):
            est.score(Q[60:], R, n_neighbors=5)


def test_adacur_ridge_range_error_comes_before_the_first_round_heavy_calls(data):
    Q, I = data
    f = CountingRelevance(lambda q, i: 1e200 * _tanh(q, i))
    ada = AdaCURRetriever(f, n_calls=8, n_rounds=2, random_state=0).fit(Q[:60], I)
    f.pairs = 0
    ada.set_params(ridge=1e-300)  # ridge / unit**2 underflows float64
    with pytest.raises(ValueError, match="ridge=1e-300 is out of range"):
        ada.kneighbors(Q[60:], 3)
    assert f.pairs == 0


# -- scale -----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["kmeans", "farthest", "greedy", "popular"])
@pytest.mark.parametrize("scale", [2.0**560, 2.0**-560, 2.0**600, 2.0**1000, 2.0**1022,
                                   2.0**-1000, 2.0**-1020])
def test_selection_picks_do_not_depend_on_the_scale(method, scale):
    """Relevance of 1e162 overflowed the squared distances of k-means and
    farthest-point (one cluster; every distance inf), 1e-163 underflowed them; relevance
    near the float64 maximum (2**1022) overflowed the centring (an OverflowError of
    kmeans, farthest and greedy; every "popular" mean inf). A power-of-two scale is
    exact, so the picks are identical and the scores scale by it (squared for greedy's
    MSE decreases, inf beyond the float64 range, 0 below it). Dyadic data (integers
    over 2**20), so that the scaled relevance itself is exact down to 2**-1020 (random
    normals would round into subnormals there: a different matrix)."""
    R = np.random.default_rng(1).integers(-2**20, 2**20, (20, 30)) / 2.0**20
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from scikit-learn either
        i0, s0 = select_support(R, 8, method, random_state=0, return_scores=True)
        i1, s1 = select_support(R * scale, 8, method, random_state=0, return_scores=True)
    np.testing.assert_array_equal(i1, i0)
    power = {"kmeans": 0, "farthest": 1, "popular": 1, "greedy": 2}[method]
    with np.errstate(over="ignore", under="ignore"):
        expected = s0 * scale**power if power < 2 else s0 * scale * scale
    np.testing.assert_allclose(s1, expected, rtol=1e-13, atol=np.finfo(np.float64).tiny)


@pytest.mark.parametrize("method", ["kmeans", "farthest", "greedy", "popular"])
def test_selection_of_relevance_near_the_float64_maximum(method):
    """The reviewer's case: R * 3.78e307 failed with "OverflowError: cannot convert float
    infinity to integer" (the centred item vectors overflowed before their unit was
    taken). It now picks exactly as the same relevance divided by 2**1021."""
    R = np.random.default_rng(0).standard_normal((20, 30)) * 3.78e307
    np.testing.assert_array_equal(select_support(R, 8, method, random_state=0),
                                  select_support(R / 2.0**1021, 8, method, random_state=0))


@pytest.mark.parametrize("method", ["greedy", "kmeans", "farthest"])
def test_selection_keeps_items_far_below_the_largest_relevance(method):
    """The reviewer's wide-range case: five constant items of 1e300 next to items that
    vary by 1e-30. Dividing the whole relevance by one power of two near 1e300 before
    centring flushed the small items to subnormals or zero: greedy picked nothing (the
    early-stop warning), k-means and farthest-point picked the constant items. Centring
    gives a constant item an exactly zero vector whatever its value, so the picks must
    equal those with the constants set to 1."""
    noise = 1e-30 * np.random.default_rng(0).standard_normal((20, 25))
    R = np.c_[np.full((20, 5), 1e300), noise]
    R1 = np.c_[np.ones((20, 5)), noise]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no early-stop warning
        idx = select_support(R, 5, method, random_state=0)
    np.testing.assert_array_equal(idx, select_support(R1, 5, method, random_state=0))
    assert len(idx) == 5 and (idx >= 5).sum() >= 4


def test_popular_ranks_wide_range_means_as_float64():
    """Column means of 1e-30 items next to 1e300 items underflowed to ties (picked in
    index order); the ranking is numpy's float64 means, stably sorted."""
    base = np.random.default_rng(0).standard_normal((20, 30))
    R = np.c_[base[:, :10] * 1e300, base[:, 10:] * 1e-30]
    idx, scores = select_support(R, 30, "popular", return_scores=True)
    mean = R.mean(axis=0)
    np.testing.assert_array_equal(idx, np.argsort(-mean, kind="stable"))
    np.testing.assert_allclose(scores, mean[idx], rtol=1e-12)


# -- paths no other test reached -------------------------------------------------
@pytest.mark.parametrize("method", ["gram", "lowrank"])
def test_greedy_on_zero_items_picks_nothing_with_the_early_stop_warning(method):
    """"lowrank" (the default) failed with torch.cat's "expected a non-empty list" where
    "gram" returned no pick."""
    with pytest.warns(UserWarning, match="stopped after 0 of 2"):
        idx, gains = greedy_selection(torch.empty(0, 3, dtype=torch.float64), 2, method=method)
    assert idx.shape == (0,) and gains.shape == (0,)


def test_unsized_queries_are_refused_by_name(data):
    Q, I = data
    with pytest.raises(TypeError, match="train_queries must be a sized sequence"):
        RelevanceBasedRetriever(_tanh, n_support=4).fit((q for q in Q[:60]), I)


@pytest.mark.parametrize("make", [set, dict.fromkeys], ids=["set", "dict"])
@pytest.mark.parametrize("estimator", ["rbe", "adacur"])
def test_unindexable_catalogues_are_refused_before_any_heavy_call(data, make, estimator):
    # regression: a set of items was scored, then failed at the support items with
    # "'set' object is not subscriptable" after all the heavy calls
    from mlpapers.retrieval.rbe import AdaCURRetriever

    Q, I = data
    calls = []

    def f(q, i):
        calls.append(1)
        return _tanh(q, i)

    est = (RelevanceBasedRetriever(f, n_support=4) if estimator == "rbe"
           else AdaCURRetriever(f, n_calls=8, n_rounds=2))
    items = make(tuple(row) for row in I)
    with pytest.raises(TypeError, match=r"items must be an indexable sequence.*pass a list"):
        est.fit(Q[:60], items)
    assert not calls


def test_a_tuple_of_queries_is_passed_as_given_and_scores_as_the_list(data):
    """Containers other than arrays, tensors, lists and pandas objects reach relevance_fn
    as given (``fresh``): a tuple cannot be changed in place."""
    Q, I = data
    seen = []

    def f(q, i):
        seen.append(type(q))
        return _tanh(q, i)

    est = RelevanceBasedRetriever(f, n_support=6).fit(Q[:60], I)
    queries = tuple(Q[60:])
    seen.clear()
    out = est.predict(queries)
    assert seen == [tuple]
    np.testing.assert_array_equal(out, est.predict(list(Q[60:])))


def test_hit_rate_refuses_one_dimensional_predictions():
    with pytest.raises(ValueError, match=r"pred_indices must have shape \(1, m\)"):
        hit_rate([[0.1, 0.9, 0.5]], [1, 0])


@pytest.mark.parametrize("kw,name", [(dict(rcond=-1e-3), "rcond"),
                                     (dict(n_rerank=41), "n_rerank=41")])
def test_bad_solve_and_rerank_parameters_are_refused_by_name(data, kw, name):
    Q, I = data
    f = CountingRelevance(_tanh)
    with pytest.raises(ValueError, match=name):
        RelevanceBasedRetriever(f, n_support=4, **kw).fit(Q[:60], I)
    assert f.pairs == 0
