"""The neural RBE head trains in the relevance's own unit, whatever that unit is.

Regression: Adam's steps are absolute, and the head was trained on the relevance as
given unless its magnitude was beyond 2**+-40: ``loss="mse"`` diverged on relevance of
spread 1e-4 (HitRate@10 0.15 against 0.69 at spread 1), subnormal relevance made every
score NaN (a unit whose inverse overflowed), and a ranker that ignores the query (no
support items) crashed the neural fit.
"""

import warnings

import numpy as np
import pytest

from mlpapers.retrieval.rbe import RelevanceBasedRetriever

from .test_rbe_numerics import _heavy_problem


def _problem():
    return _heavy_problem(300, 80, 5)


def _mlp(heavy, **kw):
    kw = dict(n_support=10, head="mlp", max_iter=60, eval_every=20, mlp_hidden=8,
              random_state=0) | kw
    return RelevanceBasedRetriever(heavy, **kw)


@pytest.mark.parametrize("loss", ["mse", "softmax_signed"])
@pytest.mark.parametrize("scale", [2.0**-14, 2.0**20])
def test_scaling_the_relevance_by_a_power_of_two_scales_the_scores(scale, loss):
    Q, items, heavy = _problem()
    base = _mlp(heavy, loss=loss, validation_fraction=0).fit(Q[:200], items)
    scaled = _mlp(lambda q, i: scale * heavy(q, i), loss=loss,
                  validation_fraction=0).fit(Q[:200], items)
    np.testing.assert_array_equal(scaled.support_indices_, base.support_indices_)
    # the same training in other units: the same scores, scaled (float32 rounding)
    np.testing.assert_allclose(scaled.predict(Q[200:]), scale * base.predict(Q[200:]),
                               rtol=1e-5, atol=1e-6 * scale)
    assert scaled.head_units_[1] == scale * base.head_units_[1]


def test_a_small_unit_trains_as_well_as_unit_relevance():
    Q, items, heavy = _problem()
    hits = [_mlp(lambda q, i, c=c: c * heavy(q, i), loss="mse", max_iter=300,
                 validation_fraction=0).fit(Q[:200], items).score(Q[200:], n_neighbors=10)
            for c in (1e-4, 1.0)]
    assert hits[0] == pytest.approx(hits[1], abs=0.02), hits


def test_subnormal_relevance_gives_finite_scores_without_warnings():
    Q, items, heavy = _problem()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        m = _mlp(lambda q, i: 1e-310 * heavy(q, i)).fit(Q[:200], items)
        P = m.predict(Q[200:])
    assert np.isfinite(P).all() and P.dtype == np.float64
    lin = RelevanceBasedRetriever(lambda q, i: 1e-310 * heavy(q, i), n_support=10,
                                  random_state=0).fit(Q[:200], items)
    assert m.score(Q[200:], n_neighbors=10) >= lin.score(Q[200:], n_neighbors=10) - 0.1


def test_a_ranker_without_query_dependence_keeps_the_linear_model():
    Q, items, _ = _problem()

    def popularity(q, i):  # every query ranks the items alike: nothing to select
        return np.tile(np.asarray(i)[:, 0], (len(q), 1))
    with pytest.warns(UserWarning, match="stopped after 0 of 5"):
        m = _mlp(popularity, n_support=5).fit(Q[:50], items)
    assert m.head_ is None and m.head_units_ is None and m.n_calls_per_query_ == 0
    np.testing.assert_allclose(m.predict(Q[:3]), popularity(Q[:3], items), atol=1e-12)

