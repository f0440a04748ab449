"""float32 scores far from 0: L and the weights e^{s - nu} to float64 accuracy.

Regression: L and nu were rounded to the scores' float32, whose step near 3e7 is 2, so a
first visit's nu = L lost its log k and the weights were off by e^{rounding}: the gradient
of the large score of [0, 3e7] was 0.5 (0.9944 at 1e6), not the softmax's 1.
"""

import numpy as np
import pytest
import torch

from mlpapers.optim.scent import EntropicRiskLoss


@pytest.mark.parametrize("method", ["scent", "sox", "asgd", "umax", "asgd_softplus", "bsgd"])
@pytest.mark.parametrize("offset", [1e4, 1e6, 3e7])
@pytest.mark.parametrize("masked", [False, True])
def test_float32_gradients_match_float64_at_large_scores(method, offset, masked):
    rng = np.random.default_rng(0)
    # values float32 holds exactly: both dtypes see the same scores
    base = (rng.standard_normal((3, 5)) * 3 + offset).astype(np.float32).astype(np.float64)
    base[:, 0] += 64.0  # (exact in float32)
    grads = {}
    for dtype in (torch.float32, torch.float64):
        loss = EntropicRiskLoss(3, method=method)
        for step in range(2):  # a first visit, then an update of the duals
            s = torch.tensor(base + 2.0 * step, dtype=dtype, requires_grad=True)  # (exact)
            # a masked largest score: the shift is the largest *valid* one
            mask = torch.ones(3, 5, dtype=torch.bool)
            mask[:, 0] = False
            out = loss(s, torch.arange(3), mask=mask if masked else None)
            assert out.dtype == dtype
            out.backward()
        grads[dtype] = s.grad.double()
    # the same scores: only the float32 rounding of the weights themselves remains
    np.testing.assert_allclose(grads[torch.float32], grads[torch.float64],
                               rtol=1e-6, atol=1e-7)
