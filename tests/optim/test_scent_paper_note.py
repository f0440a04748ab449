"""SCENT: the paper note's checks that no other test pinned.

* section 7 (proposed API): the default parameters of ``EntropicRiskLoss``,
  ``SCENTClassifier``, the KL-DRO estimators and ``PartialAUCClassifier``, and what
  the defaults mean (the dual updates they give, ``log_alpha=None`` as log C,
  ``fit_intercept``);
* section 5, check 4 (micro-benchmark): SPMD reaches nu* in a few steps from
  far starts, SGD on the dual needs far more, over the note's grid of starts and steps;
* section 6 (pitfalls, "log gamma statistics"): ``EntropicRiskLoss.last_stats``.
"""

import inspect
import math

import numpy as np
import pytest
import torch
from scipy.special import expit, logsumexp

from mlpapers.datasets import make_extreme_classification
from mlpapers.optim.scent import (
    METHODS,
    EntropicRiskLoss,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
)
from tests.optim.test_scent_issue_spec import _reference_step

f64 = torch.float64


def defaults(cls):
    return {name: p.default for name, p in inspect.signature(cls).parameters.items()}


# -- section 7: defaults -------------------------------------------------------------
def test_entropic_risk_loss_defaults_are_the_notes():
    """`EntropicRiskLoss(n_anchors, method="scent", log_alpha=0.0, temperature=1.0,
    gamma=0.9, dual_lr=0.1, delta=1.0, rho=1e-3)`; `nu_init=None` (first visit nu = L)."""
    d = defaults(EntropicRiskLoss)
    assert d["method"] == "scent" and d["log_alpha"] == 0.0 and d["temperature"] == 1.0
    assert d["gamma"] == 0.9 and d["dual_lr"] == 0.1 and d["delta"] == 1.0
    assert d["rho"] == 1e-3 and d["nu_init"] is None


@pytest.mark.parametrize("method", METHODS)
def test_default_loss_takes_the_note_step_of_its_defaults(method):
    """A loss built with the defaults only takes each method's note update (reference
    `_reference_step`) at tau = 1, alpha = 1, gamma = 0.9, dual_lr = 0.1, delta = 1
    (shifts of L - nu on both sides of 1, so U-max resets some anchors only) and
    rho = 1e-3: the stored parameters are the ones used."""
    rng = np.random.default_rng(5)
    B, k = 5, 6
    first = rng.normal(size=(B, k))
    shift = np.array([0.2, 0.6, 1.4, 2.0, -0.5])  # L - nu_old at the second visit
    loss_fn = EntropicRiskLoss(7, method=method)
    index = torch.tensor([6, 0, 2, 4, 1])
    loss_fn(torch.as_tensor(first), index)  # first visit: nu = L
    nu_old = loss_fn.nu[index].numpy().copy()
    raw = first + shift[:, None]
    scores = torch.as_tensor(raw).requires_grad_(True)
    loss_fn(scores, index).backward()
    kw = dict(log_alpha=0.0, gamma=0.9, dual_lr=0.1, delta=1.0, rho=1e-3)
    new, weights = _reference_step(method, raw, nu_old, kw)
    if method != "bsgd":
        np.testing.assert_allclose(loss_fn.nu[index].numpy(), new, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scores.grad.numpy(), weights / (B * k), rtol=1e-10, atol=1e-14)


def test_scent_classifier_defaults_are_the_notes():
    """`SCENTClassifier(n_negatives=64, temperature=1.0, log_alpha=None, lr=1.0, epochs=20,
    batch_size=256, momentum=0.0, fit_intercept=False, random_state=None, device="cpu")`."""
    d = defaults(SCENTClassifier)
    assert d["n_negatives"] == 64 and d["temperature"] == 1.0 and d["log_alpha"] is None
    assert d["lr"] == 1.0 and d["epochs"] == 20 and d["batch_size"] == 256
    assert d["momentum"] == 0.0 and d["fit_intercept"] is False
    assert d["random_state"] is None and d["device"] == "cpu"


def test_scent_classifier_default_log_alpha_is_log_n_classes():
    """`log_alpha=None` uses log C (documented): the fit is bit-identical to one with
    log_alpha=log C and differs from log_alpha=0; the defaults also run 20 epochs
    (`n_iter_`, `loss_curve_`) and learn no intercept (`intercept_` zeros)."""
    X, y = make_extreme_classification(300, 10, 5, noise=0.5, random_state=0)
    C = len(np.unique(y))

    def fit(**kw):
        return SCENTClassifier(n_negatives=4, random_state=0, **kw).fit(X, y)

    default, log_c, zero = fit(), fit(log_alpha=math.log(C)), fit(log_alpha=0.0)
    np.testing.assert_array_equal(default.coef_, log_c.coef_)
    np.testing.assert_array_equal(default.nu_, log_c.nu_)
    assert not np.allclose(default.nu_, zero.nu_, rtol=0, atol=1e-3)
    assert default.n_iter_ == 20 and len(default.loss_curve_) == 20
    np.testing.assert_array_equal(default.intercept_, np.zeros(C))


@pytest.mark.parametrize("cls", [KLDRORegressor, KLDROClassifier])
def test_kldro_fit_intercept_defaults_to_true(cls):
    """`KLDRORegressor(..., fit_intercept=True)` (and the classifier)."""
    assert defaults(cls)["fit_intercept"] is True


def test_kldro_regressor_default_fits_the_offset_of_y():
    """The default learns an intercept: shifting y by c shifts the predictions by c
    (the losses are unchanged), which no intercept-free model can do."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.normal(size=120)

    def fit(target):
        return KLDRORegressor(epochs=20, lr=1e-2, random_state=0).fit(X, target)

    np.testing.assert_allclose(fit(y + 50.0).predict(X), fit(y).predict(X) + 50.0, atol=1e-4)


def test_kldro_classifier_default_is_invariant_to_shifted_features():
    """The default learns an intercept: shifting X by a constant vector leaves the
    decision function on the shifted data unchanged (the intercept absorbs w . c)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = (X[:, 0] + 0.5 * rng.normal(size=120) > 0).astype(int)
    c = np.array([10.0, -5.0, 3.0])

    def fit(features):
        return KLDROClassifier(epochs=20, lr=1e-2, random_state=0).fit(features, y)

    np.testing.assert_allclose(fit(X + c).decision_function(X + c),
                               fit(X).decision_function(X), atol=1e-6)


def test_partial_auc_rho_defaults_to_1e_3():
    """`PartialAUCClassifier` keeps the library's rho = 1e-3 (the note: 1e-3 for XC and
    DRO; the official pAUC code's 1e-7 is not the default)."""
    assert defaults(PartialAUCClassifier)["rho"] == 1e-3


# -- section 5, check 4: nu-only micro-benchmark ------------------------------------------
# s ~ N(5, 1), nu* = 5.5, batch 8, steps until |nu - nu*| < 0.25, the same sample
# stream for both methods. Steps over seeds 0-9 (SPMD / ASGD):
#   nu0 = 0:  a = 0.01: 4-13 / 132-165; a = 0.1: 2-9 / 98-327; a = 1: 2-9 / 137-364
#   nu0 = 20: a = 0.01: 1-3 / 1561-1591; a = 0.1: 1-9 / 153-158; a = 1: 1-9 / 15-17
#   (ASGD moves nu by at most
#   dual_lr per step while nu > L: at least ceil(20 - 5.75) = 15 steps)
NU_STAR = 5.5


def steps_to_nu_star(method, nu0, seed, **kw):
    gen = torch.Generator().manual_seed(seed)
    loss = EntropicRiskLoss(1, method=method, nu_init=nu0, **kw)
    for step in range(1, 3001):
        loss(5 + torch.randn(1, 8, generator=gen, dtype=f64), torch.tensor([0]))
        if abs(float(loss.nu[0]) - NU_STAR) < 0.25:
            return step
    return 3001


@pytest.mark.parametrize("nu0, alpha, gap", [
    (0.0, 0.01, True), (0.0, 0.1, True), (0.0, 1.0, True),
    (20.0, 0.01, True), (20.0, 0.1, True), (20.0, 1.0, False)])
def test_spmd_reaches_nu_star_in_few_steps_from_far_starts(nu0, alpha, gap):
    """'SPMD reaches nu* much faster than SGD': at most 15 steps from below (nu0 = 0) and
    above (nu0 = 20) for alpha in {0.01, 0.1, 1}, 10x fewer than ASGD with dual_lr = alpha
    where the note's grid shows the gap (at alpha' = 1 from 20 ASGD needs >= 15 steps)."""
    for seed in range(3):
        # same sample stream for both methods
        spmd = steps_to_nu_star("scent", nu0, seed, log_alpha=math.log(alpha))
        sgd = steps_to_nu_star("asgd", nu0, seed, dual_lr=alpha)
        assert spmd <= 15, (seed, spmd, sgd)
        if gap:
            assert sgd >= 10 * spmd, (seed, spmd, sgd)
        else:
            assert sgd >= math.ceil((nu0 - NU_STAR - 0.25) / alpha) > spmd, (seed, spmd, sgd)


# -- section 6: gamma statistics ------------------------------------------------------
def test_last_stats_estimate_and_gamma_at_a_temperature():
    """`last_stats["estimate"]` is tau * mean_i L_i, L_i = log mean_j exp(s_ij / tau) over
    the valid items (no test read it); with a per-anchor tensor log_alpha the gammas are
    sigma(log alpha_i + nu_i) of the previous nu (on the s / tau scale). Only SCENT
    reports gammas, and a call without an SPMD step (another method, eval mode) drops
    the previous call's."""
    rng = np.random.default_rng(3)
    tau = 2.0
    s = rng.normal(size=(4, 5)) * 3
    mask = rng.random((4, 5)) < 0.7
    mask[:, 0] = True
    log_alpha = torch.tensor([-1.0, 0.5, 2.0, -3.0], dtype=f64)
    loss = EntropicRiskLoss(4, log_alpha=log_alpha, temperature=tau, nu_init=0.3)
    loss(torch.as_tensor(s), torch.arange(4), torch.as_tensor(mask))
    old = loss.nu.numpy().copy()
    s2 = s + rng.normal(size=s.shape)
    loss(torch.as_tensor(s2), torch.arange(4), torch.as_tensor(mask))
    L = logsumexp(np.where(mask, s2 / tau, -np.inf), axis=1) - np.log(mask.sum(1))
    assert loss.last_stats["estimate"] == pytest.approx(tau * L.mean(), rel=1e-12)
    g = expit(log_alpha.numpy() + old)
    assert set(loss.last_stats) == {"estimate", "gamma_mean", "gamma_min", "gamma_max",
                                    "gamma_count"}
    assert loss.last_stats["gamma_count"] == 4
    assert loss.last_stats["gamma_mean"] == pytest.approx(g.mean(), rel=1e-12)
    assert loss.last_stats["gamma_min"] == pytest.approx(g.min(), rel=1e-12)
    assert loss.last_stats["gamma_max"] == pytest.approx(g.max(), rel=1e-12)
    loss.eval()
    loss(torch.as_tensor(s), torch.arange(4), torch.as_tensor(mask))
    L0 = logsumexp(np.where(mask, s / tau, -np.inf), axis=1) - np.log(mask.sum(1))
    assert loss.last_stats == pytest.approx({"estimate": tau * L0.mean()}, rel=1e-12)
    sox = EntropicRiskLoss(4, method="sox", temperature=tau)
    sox(torch.as_tensor(s2), torch.arange(4), torch.as_tensor(mask))
    assert sox.last_stats == pytest.approx({"estimate": tau * L.mean()}, rel=1e-12)


def test_first_visits_take_no_scent_step_and_report_no_gamma():
    """Without nu_init a first visit sets nu := L whatever gamma is: only the anchors
    seen before count in the gamma statistics (none on the very first call)."""
    rng = np.random.default_rng(4)
    s = torch.as_tensor(rng.normal(size=(4, 6)))
    loss = EntropicRiskLoss(6, log_alpha=-0.5)
    loss(s, torch.arange(4))  # anchors 0-3, all first visits
    assert "gamma_mean" not in loss.last_stats
    old = loss.nu.numpy().copy()
    loss(s + 1.0, torch.tensor([2, 3, 4, 5]))  # 2 and 3 step, 4 and 5 are first visits
    g = expit(-0.5 + old[[2, 3]])
    assert loss.last_stats["gamma_count"] == 2
    assert loss.last_stats["gamma_mean"] == pytest.approx(g.mean(), rel=1e-12)
    assert loss.last_stats["gamma_min"] == pytest.approx(g.min(), rel=1e-12)


# -- the note's pitfall "log gamma statistics": gamma_curve_ -----------------------------
@pytest.mark.parametrize("log_alpha", [0.0, -1.5])
def test_kldro_gamma_curve_is_sigmoid_of_log_alpha_plus_the_previous_nu(log_alpha):
    """With one full batch per epoch and a constant rate, epoch 2's gamma is
    sigma(log alpha + nu) at the nu an identical 1-epoch fit ends with."""
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X, y = X[:100], (y[:100] - y.mean()) / y.std()
    kw = dict(lam=1.0, lr=1e-3, batch_size=100, lr_schedule="constant", random_state=0,
              log_alpha=log_alpha)
    one = KLDRORegressor(epochs=1, **kw).fit(X, y)
    two = KLDRORegressor(epochs=2, **kw).fit(X, y)
    assert len(two.gamma_curve_) == 2
    np.testing.assert_allclose(two.gamma_curve_[1], 1 / (1 + np.exp(-(log_alpha + one.nu_))),
                               rtol=1e-12)
    bsgd = KLDRORegressor(epochs=2, method="bsgd", **kw).fit(X, y)
    assert len(bsgd.gamma_curve_) == 2 and np.isnan(bsgd.gamma_curve_).all()


def test_gamma_curve_has_one_entry_per_epoch_for_every_estimator():
    """Per epoch (also across partial_fit calls), in (0, 1) for SCENT, NaN for others."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 5))
    y = rng.integers(0, 6, 120)
    clf = SCENTClassifier(epochs=3, n_negatives=3, random_state=0).fit(X, y)
    clf.partial_fit(X, y)
    assert len(clf.gamma_curve_) == len(clf.loss_curve_) == 4
    # epoch 1 visits every anchor for the first time: nu := L, no SCENT step to report
    assert np.isnan(clf.gamma_curve_[0]) and all(0 < g < 1 for g in clf.gamma_curve_[1:])
    sox = SCENTClassifier(epochs=2, n_negatives=3, method="sox", random_state=0).fit(X, y)
    assert len(sox.gamma_curve_) == 2 and np.isnan(sox.gamma_curve_).all()
    pauc = PartialAUCClassifier(epochs=2, random_state=0).fit(X, (y == 0).astype(int))
    assert len(pauc.gamma_curve_) == 2 and np.isnan(pauc.gamma_curve_[0])
    assert 0 < pauc.gamma_curve_[1] < 1
