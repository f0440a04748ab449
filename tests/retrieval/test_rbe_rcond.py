"""``rcond`` is a relative cutoff in [0, 1): a cutoff of 1 or more drops every singular
value and used to give every query the same items, silently."""

import numpy as np
import pytest
import torch

from mlpapers.retrieval import AdaCURRetriever, AnnCURRetriever, RelevanceBasedRetriever
from mlpapers.retrieval.rbe import cur_query_weights, fit_linear_embeddings

RNG = np.random.default_rng(0)
QTR, QTE, ITEMS = (RNG.standard_normal((n, 12)) for n in (50, 10, 40))


def _relevance(q, i):
    return np.asarray(q) @ np.asarray(i).T


ARMS = [(AnnCURRetriever, dict(n_support=10)),
        (AdaCURRetriever, dict(n_calls=15, n_rounds=3)),
        (RelevanceBasedRetriever, dict(n_support=10))]


@pytest.mark.parametrize("cls, kw", ARMS)
@pytest.mark.parametrize("rcond", [1.0, 1.5, float("nan"), -0.1])
def test_rcond_outside_the_unit_interval_is_refused_at_fit(cls, kw, rcond):
    # rcond=1.0 gave AnnCUR zero scores and items [0, 1, 2] for every query (top-1 0.0)
    with pytest.raises(ValueError, match=r"rcond must be in \[0, 1\)"):
        cls(_relevance, rcond=rcond, random_state=0, **kw).fit(QTR, ITEMS)


@pytest.mark.parametrize("cls, kw", ARMS)
def test_rcond_of_wrong_type_is_refused(cls, kw):
    with pytest.raises(TypeError, match="rcond must be a real number"):
        cls(_relevance, rcond="1e-6", random_state=0, **kw).fit(QTR, ITEMS)


@pytest.mark.parametrize("cls, kw", ARMS)
def test_a_cutoff_just_below_one_is_accepted(cls, kw):
    # the boundary is exclusive: 0.5 is a valid (coarse) cutoff that still keeps the
    # largest singular direction(s)
    est = cls(_relevance, rcond=0.5, random_state=0, **kw).fit(QTR, ITEMS)
    scores = est.predict(QTE)
    assert np.isfinite(scores).all() and scores.shape == (len(QTE), len(ITEMS))


def test_adacur_checks_rcond_set_after_fit_before_its_per_query_solves():
    est = AdaCURRetriever(_relevance, n_calls=15, n_rounds=3, random_state=0).fit(QTR, ITEMS)
    est.set_params(rcond=1.0)
    with pytest.raises(ValueError, match="rcond"):
        est.predict(QTE)


def test_kernels_refuse_a_cutoff_of_one():
    R = torch.as_tensor(QTR @ ITEMS.T)
    with pytest.raises(ValueError, match="rcond"):
        fit_linear_embeddings(R[:, :10], R, rcond=1.0)
    C = R[:10, :5].T[None]  # one query, 5 anchor items, 10 anchor queries
    with pytest.raises(ValueError, match="rcond"):
        cur_query_weights(C, R[:1, :5], rcond=1.0)
    assert cur_query_weights(C, R[:1, :5], rcond=0.5).shape == (1, 10)
