"""Predicted keys of huge keys rank in the network's units; keys that are not finite are
refused instead of ranking every key alike.

Regressions: KeyNet keys of 1e20 (``key_scale_`` 2**66) were scaled to data units and
back before ranking, which overflowed float32: ``predict`` returned index 0 for every
query and ``kneighbors`` other arbitrary keys. SupportNet queries of 1e36 give NaN keys
(the gradient through the norm's scale overflows); ``predict_key`` returned -inf or
NaN, all with no error (``value`` already raised).
"""

import numpy as np
import pytest

from mlpapers.retrieval.amips import AmortizedMIPS


def _overflowing_keynet():
    rng = np.random.default_rng(0)
    K, X = rng.normal(size=(50, 4)) * 1e20, rng.normal(size=(5, 4)) * 1e20
    return AmortizedMIPS(depth=2, hidden_dim=16, n_steps=20, random_state=0).fit(K), K, X


def test_huge_keys_are_ranked_by_the_networks_keys():
    est, K, X = _overflowing_keynet()
    # the same network on the keys scaled into range (2**-66 exactly): the same ranking
    small = AmortizedMIPS(depth=2, hidden_dim=16, n_steps=20, random_state=0).fit(
        K * 2.0**-66)
    np.testing.assert_array_equal(est.predict(X), small.predict(X * 2.0**-66))
    idx = est.kneighbors(X, 3, return_distance=False)
    np.testing.assert_array_equal(idx[:, 0], est.predict(X))
    # re-ranking every key: the exact answer (float64 products)
    exact = np.argmax(X @ K.T, axis=1)
    np.testing.assert_array_equal(est.set_params(n_candidates=50).predict(X), exact)


@pytest.mark.parametrize("call", ["predict_key", "transform"])
def test_keys_beyond_float32_cannot_be_returned(call):
    est, _, X = _overflowing_keynet()
    with pytest.raises(ValueError, match="predicted keys of some queries are not finite"):
        getattr(est, call)(X)  # (the network's keys times 2**66 leave float32)


def test_nan_keys_of_huge_queries_raise_for_supportnet():
    rng = np.random.default_rng(0)
    K, X = rng.normal(size=(60, 4)), rng.normal(size=(5, 4)).astype(np.float32)
    est = AmortizedMIPS(arch="supportnet", depth=2, hidden_dim=16, n_steps=20,
                        random_state=0).fit(K)
    assert est.predict(X).shape == (5,)
    with pytest.raises(ValueError, match="not finite"):
        est.predict(X * 1e36)
