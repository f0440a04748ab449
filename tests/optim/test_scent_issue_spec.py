"""Issue #3 (optim.scent) read as an acceptance test: public names, signatures and the
listed behaviours, checked against references written from the issue and the paper note."""

import inspect

import numpy as np
import pytest
import torch
from scipy.special import expit, logsumexp

import mlpapers.optim as optim
import mlpapers.optim.scent as scent
from mlpapers.datasets import make_extreme_classification
from mlpapers.optim.scent import EntropicRiskLoss

METHODS = ["scent", "bsgd", "asgd", "asgd_softplus", "umax", "sox"]


@pytest.mark.parametrize("name", ["spmd_update", "EntropicRiskLoss", "SCENTClassifier",
                                  "KLDRORegressor", "KLDROClassifier",
                                  "PartialAUCClassifier", "objective"])
def test_public_names_in_both_module_paths(name):
    """'Public API (`mlpapers.optim.scent`, re-exported from `mlpapers.optim`)'."""
    assert getattr(optim, name) is getattr(scent, name)


def test_signatures_and_defaults_of_the_issue():
    """The issue's spellings: `spmd_update(nu, log_mean_exp, log_alpha)`,
    `EntropicRiskLoss(n_anchors, method="scent", log_alpha=...)`, `forward(scores, index,
    mask=None)`, `SCENTClassifier(n_negatives=64, method="scent")`, `KLDRO*(lam=1.0)`,
    `PartialAUCClassifier(margin=1.0, max_fpr=0.3)`,
    `make_extreme_classification(n_samples, n_classes, n_features, ...)`."""
    def params(f):
        return inspect.signature(f).parameters

    assert list(params(scent.spmd_update))[:3] == ["nu", "log_mean_exp", "log_alpha"]
    p = params(EntropicRiskLoss)
    assert list(p)[:3] == ["n_anchors", "method", "log_alpha"] and p["method"].default == "scent"
    p = params(EntropicRiskLoss.forward)
    assert list(p)[1:] == ["scores", "index", "mask"] and p["mask"].default is None
    p = params(scent.SCENTClassifier)
    assert p["n_negatives"].default == 64 and p["method"].default == "scent"
    for cls in (scent.KLDRORegressor, scent.KLDROClassifier):
        assert params(cls)["lam"].default == 1.0
    p = params(scent.PartialAUCClassifier)
    assert "lam" in p and p["margin"].default == 1.0 and p["max_fpr"].default == 0.3
    assert list(params(make_extreme_classification))[:3] == ["n_samples", "n_classes",
                                                              "n_features"]
    X, y = make_extreme_classification(50, 5, 3, random_state=0)  # positionally
    assert X.shape == (50, 3) and y.shape == (50,) and 0 <= y.min() and y.max() < 5


def _reference_step(method, s, nu_old, kw):
    """Dual update and primal weights d(loss)/d(scores) * B * k, from the paper note."""
    L = logsumexp(s, axis=1) - np.log(s.shape[1])
    if method == "scent":
        a = kw["log_alpha"] + nu_old
        new = np.logaddexp(nu_old - np.logaddexp(0, a), a - np.logaddexp(0, a) + L)
        return new, np.exp(s - new[:, None])
    if method == "sox":
        g = kw["gamma"]
        new = np.log((1 - g) * np.exp(nu_old) + g * np.exp(L))
        return new, np.exp(s - new[:, None])
    if method == "bsgd":  # plug-in, stateless: softmax weights times k
        return nu_old, s.shape[1] * np.exp(s - logsumexp(s, axis=1, keepdims=True))
    if method == "asgd":  # SGD on the dual; primal weights with the old nu
        new = nu_old - kw["dual_lr"] * (1 - np.exp(L - nu_old))
        return new, np.exp(s - nu_old[:, None])
    if method == "umax":  # reset to L when nu < L - delta, then the SGD step; new nu
        reset = np.where(nu_old < L - kw["delta"], L, nu_old)
        new = reset - kw["dual_lr"] * (1 - np.exp(L - reset))
        return new, np.exp(s - new[:, None])
    rho = kw["rho"]  # asgd_softplus: e^x -> log(1 + rho e^x) / rho; old nu
    z = s - nu_old[:, None] + np.log(rho)
    new = nu_old - kw["dual_lr"] * (1 - expit(z).mean(1) / rho)
    return new, expit(z) / rho


@pytest.mark.parametrize("method", METHODS)
def test_each_method_is_the_note_update(method):
    """'`method` selects SCENT or a baseline ... each exactly as in the note'; forward
    'returns the surrogate whose gradient is the method's direction' (weights exp(s - nu),
    nu detached), at a temperature tau != 1 (scores s / tau, loss times tau)."""
    rng = np.random.default_rng(1234)
    tau, B, k = 0.7, 5, 4
    kw = dict(log_alpha=0.4, gamma=0.3, dual_lr=0.2, delta=0.25, rho=1e-2)
    loss_fn = EntropicRiskLoss(9, method=method, temperature=tau, **kw)
    index = torch.tensor([8, 0, 3, 5, 1])
    loss_fn(torch.as_tensor(rng.normal(size=(B, k)) * 2), index)  # first visit: nu = L
    nu_old = loss_fn.nu[index].numpy().copy()
    raw = rng.normal(size=(B, k)) * 2
    scores = torch.as_tensor(raw).requires_grad_(True)
    loss_fn(scores, index).backward()
    new, weights = _reference_step(method, raw / tau, nu_old, kw)
    if method != "bsgd":
        np.testing.assert_allclose(loss_fn.nu[index].numpy(), new, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scores.grad.numpy(), weights / (B * k), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("pad", [float("-inf"), float("inf"), float("nan"), 1e38])
def test_masked_items_may_hold_any_value(method, pad):
    """forward's `mask=None` argument: masked items are ignored. Regression: a masked -inf
    (how the official code masks the positive class), +inf or NaN raised "scores contain NaN
    or infinity", and a masked 1e38 at temperature 0.1 raised a float32 overflow error, while
    `objective` and `log_mean_exp` ignored them."""
    rng = np.random.default_rng(7)
    s = rng.normal(size=(3, 5)).astype(np.float32)
    mask = torch.as_tensor(rng.random((3, 5)) < 0.6)
    mask[:, 0] = True
    clean = torch.as_tensor(s).requires_grad_(True)
    padded = torch.as_tensor(np.where(mask.numpy(), s, np.float32(pad))).requires_grad_(True)
    fns = [EntropicRiskLoss(3, method=method, temperature=0.1, log_alpha=0.3) for _ in "ab"]
    for _ in range(2):  # first visit, then a regular update
        a = fns[0](clean, torch.arange(3), mask=mask)
        b = fns[1](padded, torch.arange(3), mask=mask)
    (ga,) = torch.autograd.grad(a, clean)
    (gb,) = torch.autograd.grad(b, padded)
    assert torch.isfinite(b) and torch.equal(a, b)
    assert torch.equal(ga, gb) and not bool(gb[~mask].any())
    assert torch.equal(fns[0].nu, fns[1].nu)
    fns[1].eval()  # the eval-mode plug-in value ignores them as well
    assert torch.isfinite(fns[1](padded, torch.arange(3), mask=mask))
