"""Configurations of the official SCENT code that the estimators must accept.

Expected values come from the update equations of the paper note (closed forms),
not from the official code.
"""

import math

import numpy as np
import pytest
import torch

from mlpapers.optim import KLDRORegressor, PartialAUCClassifier
from mlpapers.optim.scent import EntropicRiskLoss


def test_umax_delta_zero_resets_whenever_nu_lags():
    # delta = 0 is the default of the official KL-DRO and pAUC U-max: reset nu := L whenever
    # nu < L, then nu <- nu - a (1 - exp(L - nu)); the primal weights use the new nu
    loss_fn = EntropicRiskLoss(2, method="umax", delta=0.0, dual_lr=0.3, nu_init=0.0)
    s = torch.tensor([[1.0, 2.0, 0.5], [-3.0, -2.0, -4.0]], dtype=torch.float64,
                     requires_grad=True)
    loss_fn(s, torch.tensor([0, 1])).backward()
    L = torch.logsumexp(s.detach(), 1) - math.log(3)
    # anchor 0: nu0 = 0 < L -> reset to L, then a zero step; anchor 1: L < 0, no reset
    want = torch.stack([L[0], 0.0 - 0.3 * (1.0 - torch.exp(L[1]))])
    torch.testing.assert_close(loss_fn.nu, want)
    torch.testing.assert_close(s.grad, torch.exp(s.detach() - want[:, None]) / 6)


@pytest.mark.parametrize("cls", [KLDRORegressor, PartialAUCClassifier])
def test_estimators_accept_umax_delta_zero(cls):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = X[:, 0] + 0.1 * rng.normal(size=60)
    if cls is PartialAUCClassifier:
        y = (y > 0.5).astype(int)
    est = cls(method="umax", delta=0.0, epochs=2, random_state=0).fit(X, y)
    assert np.all(np.isfinite(est.coef_))
    with pytest.raises(ValueError, match="delta"):
        cls(method="umax", delta=-1.0, epochs=1).fit(X, y)
