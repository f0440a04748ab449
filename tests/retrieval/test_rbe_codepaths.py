"""RBE code paths no other test reached (session 19 coverage audit), and the errors that
came after the heavy-ranker calls they were meant to spare."""

import warnings

import numpy as np
import pytest
import torch

from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
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
@pytest.mark.parametrize("method", ["kmeans", "farthest"])
@pytest.mark.parametrize("scale", [2.0**540, 2.0**-540])
def test_kmeans_and_farthest_picks_do_not_depend_on_the_scale(method, scale):
    """As greedy's: relevance of 1e162 overflowed the squared distances (k-means found
    one cluster, every farthest-point distance was inf), 1e-163 underflowed them. A
    power-of-two scale is exact, so the picks are identical and the farthest-point
    distances scale by it exactly."""
    R = np.random.default_rng(1).standard_normal((20, 30))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from scikit-learn either
        i0, s0 = select_support(R, 8, method, random_state=0, return_scores=True)
        i1, s1 = select_support(R * scale, 8, method, random_state=0, return_scores=True)
    np.testing.assert_array_equal(i1, i0)
    np.testing.assert_array_equal(s1, s0 * (scale if method == "farthest" else 1.0))


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
