"""SupportNet's input gradient works under the caller's saved-tensor hooks.

Its no-graph path used ``torch.func.grad``, which refuses saved-tensor hooks: inside
``torch.autograd.graph.save_on_cpu()`` every ``fit``, ``predict`` and ``predict_key``
of a SupportNet model failed with a torch error. Plain autograd gives the same values.
"""

import numpy as np
import pytest
import torch

from mlpapers.retrieval.amips import AmortizedMIPS

KEYS = np.random.default_rng(0).standard_normal((40, 6)).astype(np.float32)
QUERIES = np.random.default_rng(1).standard_normal((7, 6)).astype(np.float32)


def _fit(**kw):
    return AmortizedMIPS(depth=2, hidden_dim=16, n_steps=8, random_state=0, **kw).fit(KEYS)


@pytest.mark.parametrize("kw", [dict(arch="supportnet"),
                                dict(arch="supportnet", homogenize=False),
                                dict(arch="keynet")])
def test_results_under_save_on_cpu_equal_those_outside(kw):
    est = _fit(**kw)
    expected = est.predict(QUERIES), est.predict_key(QUERIES), est.kneighbors(QUERIES, 3)
    with torch.autograd.graph.save_on_cpu():
        got = est.predict(QUERIES), est.predict_key(QUERIES), est.kneighbors(QUERIES, 3)
        refit = _fit(**kw)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    for a, b in zip(got[2], expected[2]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(refit.predict_key(QUERIES), expected[1])


def test_public_score_and_key_under_hooks_matches_autograd():
    model = _fit(arch="supportnet").model_
    x = torch.from_numpy(QUERIES)
    with torch.autograd.graph.save_on_cpu():
        value, key = model.score_and_key(x)
    xr = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(model(xr).sum(), xr)
    torch.testing.assert_close(key, expected, rtol=0, atol=0)
    assert not key.requires_grad and not value.requires_grad
