"""Parity between AMIPS code paths that claim to agree.

Each test names the two paths it compares: chunked against unchunked inference,
fit_transform against fit then transform, the estimators against the public kernels
and metric functions, and the re-ranking rule against its documented recall.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlpapers.retrieval.amips import (
    AmortizedMIPS,
    ExactMIPS,
    match_rate,
    mips_topk,
    rank_by_key,
    recall_at_k,
)

SMALL = dict(depth=2, hidden_dim=16, n_steps=15, batch_size=8, random_state=0)


def _problem(seed: int, n_keys: int = 23, d: int = 4, n_queries: int = 13):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n_keys, d)) * rng.lognormal(size=(n_keys, 1))
    return keys, rng.standard_normal((n_queries, d))


@pytest.mark.parametrize("seed,n_keys,n_queries", [(0, 7, 1), (1, 33, 9), (2, 50, 40)])
def test_exact_mips_chunks_match_the_kernel_and_float64(seed, n_keys, n_queries):
    """ExactMIPS.kneighbors / predict for batch_size 1, 7 and > n vs mips_topk with the
    same chunking, and vs a float64 stable argsort of Q K^T (all keys, k = n_keys)."""
    keys, Q = _problem(seed, n_keys=n_keys, n_queries=n_queries)
    ref = np.argsort(-(Q @ keys.T), axis=1, kind="stable")
    for bs in (1, 7, 10_000):
        mips = ExactMIPS(batch_size=bs).fit(keys)
        sims, idx = mips.kneighbors(Q, n_keys)
        np.testing.assert_array_equal(idx, ref)
        np.testing.assert_array_equal(mips.predict(Q), idx[:, 0])
        np.testing.assert_array_equal(mips.kneighbors(Q, 3, return_distance=False),
                                      idx[:, :3])
        ks, ki = mips_topk(torch.as_tensor(Q, dtype=torch.float32),
                           torch.as_tensor(keys, dtype=torch.float32), n_keys, batch_size=bs)
        np.testing.assert_array_equal(ki.numpy(), idx)
        np.testing.assert_array_equal(ks.numpy(), sims)


@pytest.mark.parametrize("arch", ["keynet", "supportnet"])
@pytest.mark.parametrize("retrieval", ["ip", "l2"])
def test_inference_chunk_sizes_agree(arch, retrieval):
    """predict_key / value / predict / kneighbors with batch_size and search_batch_size
    of 1 and > n_queries vs the defaults used in fit (float32 rounding for the network
    outputs, identical indices), and a single query vs its row of the batch."""
    keys, Q = _problem(3)
    model = AmortizedMIPS(arch=arch, retrieval=retrieval, **SMALL).fit(keys)
    key, value = model.predict_key(Q), model.value(Q)
    order = model.kneighbors(Q, len(keys), return_distance=False)
    # float32 rounding at the outputs' scale: which matmul kernel BLAS picks depends on
    # the batch's size and on the CPU, and a small entry of a large key can lose more
    # than its own 1e-5 (6e-6 on a 0.026 entry of a key of norm 50 on an AVX2 machine)
    key_atol = 1e-6 * float(np.abs(key).max())
    value_atol = 1e-6 * float(np.abs(value).max())
    for bs in (1, 5, 10_000):
        model.set_params(batch_size=bs, search_batch_size=bs)
        np.testing.assert_allclose(model.predict_key(Q), key, rtol=1e-5, atol=key_atol)
        np.testing.assert_allclose(model.value(Q), value, rtol=1e-5, atol=value_atol)
        np.testing.assert_array_equal(model.kneighbors(Q, len(keys), return_distance=False),
                                      order)
        np.testing.assert_array_equal(model.predict(Q), order[:, 0])
    np.testing.assert_allclose(model.predict_key(Q[4:5]), key[4:5], rtol=1e-5, atol=key_atol)
    # ranking by the public kernel from the predicted keys: the same order
    idx = rank_by_key(torch.as_tensor(key), torch.as_tensor(keys, dtype=torch.float32),
                      len(keys), metric=retrieval)
    np.testing.assert_array_equal(np.asarray(idx), order)


@pytest.mark.parametrize("arch", ["keynet", "supportnet"])
def test_fit_transform_equals_fit_then_transform(arch):
    """TransformerMixin.fit_transform(X) vs fit(X).transform(X) (same seed): the same
    projected queries, which are also predict_key's."""
    keys, _ = _problem(4)
    fitted = AmortizedMIPS(arch=arch, **SMALL).fit(keys)
    np.testing.assert_array_equal(AmortizedMIPS(arch=arch, **SMALL).fit_transform(keys),
                                  fitted.transform(keys))
    np.testing.assert_array_equal(fitted.transform(keys), fitted.predict_key(keys))


@pytest.mark.parametrize("n_candidates", [3, 23])
def test_rerank_score_is_recall_at_n_candidates(n_candidates):
    """score with n_candidates vs recall_at_k(n_candidates) of the un-reranked ranking
    (the documented identity), predict vs kneighbors(n_candidates)[:, 0], and score vs
    the public tie-aware match_rate of predict against ExactMIPS."""
    keys, Q = _problem(5)
    model = AmortizedMIPS(**SMALL).fit(keys)
    exact = ExactMIPS().fit(keys).predict(Q)
    base = model.kneighbors(Q, n_candidates, return_distance=False)
    model.set_params(n_candidates=n_candidates)
    expected = recall_at_k(exact, base, n_candidates, queries=Q, database=keys)
    assert model.score(Q) == expected
    assert model.score(Q) == match_rate(exact, model.predict(Q), queries=Q, database=keys)
    np.testing.assert_array_equal(model.predict(Q),
                                  model.kneighbors(Q, n_candidates, return_distance=False)[:, 0])
    if n_candidates == len(keys):
        assert model.score(Q) == 1.0
