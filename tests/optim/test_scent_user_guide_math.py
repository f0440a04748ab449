"""The SCENT user guide's math (docs/user_guide/scent.rst) against float64 references
written from the page's formulas alone."""
import numpy as np
import pytest
import torch
from scipy.special import logsumexp

from mlpapers.optim.scent import EntropicRiskLoss


def _batch(seed, B, k, n):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(B, k)) * 2.0
    mask = rng.random((B, k)) < 0.7
    mask[:, 0] = True
    index = rng.choice(n, size=B, replace=False)
    nu0 = rng.normal(size=n) * 2.0
    return s, mask, index, nu0


def _plugin(s, mask, tau):
    """tau * mean_i L_i with L_i = log mean_{j valid} exp(s_ij / tau)."""
    L = [logsumexp(s[i][mask[i]] / tau) - np.log(mask[i].sum()) for i in range(len(s))]
    return tau * float(np.mean(L))


@pytest.mark.parametrize("method", ["scent", "sox", "asgd", "umax"])
@pytest.mark.parametrize("seed,B,k,tau", [(0, 3, 5, 1.0), (1, 7, 2, 0.3), (2, 1, 9, 2.5)])
def test_returned_value_bounds_the_batch_plugin_risk(method, seed, B, k, tau):
    """Section "API": the returned value tau mean_i[mean_j e^{s/tau - nu_i} + nu_i - 1]
    is >= the batch's plug-in risk tau mean_i L_i (dual identity), with equality at a
    first visit (nu_i = L_i). It is no bound on F: the page used to say ">= F"."""
    n = 11
    s, mask, index, nu0 = _batch(seed, B, k, n)
    plug = _plugin(s, mask, tau)
    kw = dict(method=method, temperature=tau, log_alpha=0.3, gamma=0.4, dual_lr=0.5,
              delta=0.2)
    fresh = EntropicRiskLoss(n, **kw)
    first = fresh(torch.as_tensor(s), torch.as_tensor(index), torch.as_tensor(mask))
    assert float(first) == pytest.approx(plug, rel=1e-12, abs=1e-12)
    lf = EntropicRiskLoss(n, **kw)
    with torch.no_grad():  # a visited table far from L (U-max may reset it to L)
        lf.nu.copy_(torch.as_tensor(nu0))
        lf.initialized.fill_(True)
    val = float(lf(torch.as_tensor(s), torch.as_tensor(index), torch.as_tensor(mask)))
    assert val >= plug - 1e-12 * (1 + abs(plug))
