"""New-user regressions: kneighbors agrees with predict when re-ranking (like a faiss search)."""

import numpy as np
import pytest

from mlpapers.datasets import make_mips_problem
from mlpapers.retrieval import AmortizedMIPS

FAST = dict(depth=2, hidden_dim=32, batch_size=256, lr=1e-2, random_state=0)


@pytest.fixture(scope="module")
def model_and_queries():
    keys, Q, sampler = make_mips_problem(300, 8, n_queries=200, random_state=3)
    return AmortizedMIPS(n_steps=60, **FAST).fit(keys, queries=sampler), keys, Q


@pytest.mark.parametrize("n_candidates,k", [(5, 3), (5, 5), (3, 6), (400, 4)])
def test_kneighbors_reranks_the_candidates_like_predict(model_and_queries, n_candidates, k):
    model, keys, Q = model_and_queries
    model.set_params(n_candidates=1)
    n_cand = min(max(n_candidates, k), len(keys))
    cand = model.kneighbors(Q, n_cand, return_distance=False)  # the predicted order
    # reference: true inner products of those candidates in float64, stable descending sort
    true = np.einsum("qd,qcd->qc", Q.astype(np.float64), keys.astype(np.float64)[cand])
    order = np.argsort(-true, axis=1, kind="stable")[:, :k]
    model.set_params(n_candidates=n_candidates)
    sims, idx = model.kneighbors(Q, k)
    np.testing.assert_array_equal(np.sort(idx, 1), np.sort(np.take_along_axis(cand, order, 1), 1))
    np.testing.assert_allclose(sims, np.take_along_axis(true, order, 1), rtol=1e-5, atol=1e-6)
    assert np.all(np.diff(sims, axis=1) <= 0)  # descending, as ExactMIPS and faiss
    if k <= n_candidates:  # predict re-ranks the same candidates
        np.testing.assert_array_equal(idx[:, 0], model.predict(Q))
    np.testing.assert_array_equal(model.kneighbors(Q, k, return_distance=False), idx)
    assert sims.dtype == np.float32 and idx.dtype == np.int64


def test_kneighbors_without_reranking_keeps_the_predicted_order(model_and_queries):
    model, keys, Q = model_and_queries
    model.set_params(n_candidates=1)
    sims, idx = model.kneighbors(Q, 4)
    k_hat = model.predict_key(Q).astype(np.float64)
    ref = np.argsort(-(k_hat @ keys.astype(np.float64).T), axis=1, kind="stable")[:, :4]
    assert (idx == ref).mean() > 0.99  # float32 vs float64 ranking of near ties
    np.testing.assert_array_equal(idx[:, 0], model.predict(Q))
