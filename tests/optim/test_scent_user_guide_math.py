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


@pytest.mark.parametrize("seed,B,k,tau", [(0, 3, 5, 1.0), (1, 7, 2, 0.3)])
def test_returned_value_of_bsgd_and_asgd_softplus(seed, B, k, tau):
    """Section "API": "bsgd" returns the plug-in tau mean_i L_i; "asgd_softplus" the dual
    of its safe-KL surrogate tau mean_i[rho^-1 mean_j log(1 + rho e^{s/tau - nu_i}) +
    nu_i - 1] at the old nu, which can be below the plug-in (the page said >= for all)."""
    n, rho = 11, 1e-2
    s, mask, index, nu0 = _batch(seed, B, k, n)
    args = [torch.as_tensor(a) for a in (s, index, mask)]
    plug = _plugin(s, mask, tau)
    bsgd = EntropicRiskLoss(n, method="bsgd", temperature=tau)
    assert float(bsgd(*args)) == pytest.approx(plug, rel=1e-12, abs=1e-12)
    lf = EntropicRiskLoss(n, method="asgd_softplus", temperature=tau, rho=rho, dual_lr=0.5)
    with torch.no_grad():
        lf.nu.copy_(torch.as_tensor(nu0))
        lf.initialized.fill_(True)
    val = float(lf(*args))
    nu = nu0[index]
    inner = [np.log1p(rho * np.exp(s[i][mask[i]] / tau - nu[i])).mean() / rho + nu[i] - 1
             for i in range(B)]
    assert val == pytest.approx(tau * float(np.mean(inner)), rel=1e-10)
    # a first visit (nu = L) of a single large score: below the plug-in
    first = EntropicRiskLoss(1, method="asgd_softplus", rho=rho)(
        torch.tensor([[20.0]], dtype=torch.float64), torch.tensor([0]))
    assert float(first) < 20.0
