"""A relevance with a common offset far above its spread warns before the uncentred solves."""

import warnings

import numpy as np
import pytest

from mlpapers.retrieval import AdaCURRetriever, AnnCURRetriever, RelevanceBasedRetriever

RNG = np.random.default_rng(0)
QTR, QTE, ITEMS = (RNG.standard_normal((n, 6)) for n in (80, 20, 60))
EXACT = (QTE @ ITEMS.T).argmax(1)


def _relevance(offset):
    return lambda q, i: np.asarray(q) @ np.asarray(i).T + offset


ARMS = [(AnnCURRetriever, dict(n_support=10)),
        (AdaCURRetriever, dict(n_calls=15, n_rounds=3))]


@pytest.mark.parametrize("cls, kw", ARMS)
def test_large_common_offset_warns_where_the_ranking_is_lost(cls, kw):
    # at an offset of 1e8 (about 4e7 times the spread) both lost the exact top-1 item
    # for most test queries, silently: 35% and 40% found
    with pytest.warns(UserWarning, match="common offset") as record:
        est = cls(_relevance(1e8), random_state=0, **kw).fit(QTR, ITEMS)
    assert record[0].filename == __file__
    assert (est.predict(QTE).argmax(1) == EXACT).mean() < 0.9   # the loss it warns of


@pytest.mark.parametrize("cls, kw", ARMS)
def test_moderate_offset_keeps_the_ranking_and_does_not_warn(cls, kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        est = cls(_relevance(1e4), random_state=0, **kw).fit(QTR, ITEMS)
    assert (est.predict(QTE).argmax(1) == EXACT).mean() == 1.0


def test_centred_fit_does_not_warn_and_keeps_the_ranking():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        # (greedy stops early: the relevance has rank 7, a warning of its own)
        est = RelevanceBasedRetriever(_relevance(1e8), n_support=10,
                                      random_state=0).fit(QTR, ITEMS)
    assert not [w for w in record if "common offset" in str(w.message)]
    assert (est.predict(QTE).argmax(1) == EXACT).mean() == 1.0
