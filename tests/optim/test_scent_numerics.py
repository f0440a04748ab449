"""SCENT at extreme scales: temperatures, targets, feature units, float32 range limits.

Each test pins a failure found by the numerical-robustness audit (session 11): a NaN or
inf returned silently, a wrong exact objective, or a misleading error.
"""

import math

import mpmath
import numpy as np
import pytest
import torch

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
    objective,
)


@pytest.fixture(scope="module")
def regression():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = X @ [1.0, -2.0, 0.5] + 3.0 + rng.standard_t(3, size=60)
    return X, y


def _reference(v, tau, dps=80):
    """tau log mean exp(v / tau) of float64 values, in multiprecision."""
    with mpmath.workdps(dps):
        vs = [mpmath.mpf(float(x)) for x in v]
        c, t = max(vs), mpmath.mpf(tau)
        return float(c + t * mpmath.log(mpmath.fsum(mpmath.exp((x - c) / t) for x in vs)
                                        / len(vs)))


@pytest.mark.parametrize("tau, scale", [(1e-300, 1e10), (1e-3, 1e-30), (1e12, 1.0),
                                        (1e30, 1e3), (1.0, 1.0)])
def test_objective_is_accurate_at_extreme_temperatures(tau, scale):
    # tau * log_mean_exp(s / tau) overflowed to inf for a tiny tau and rounded to 0 (or
    # lost every digit) for a large one, where the value tends to the mean score
    v = torch.rand(2, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    v = (v - 0.3) * scale
    got = float(objective(v, temperature=tau))
    ref = np.mean([_reference(row, tau, dps=400 if tau > 1e20 else 80) for row in v])
    assert got == pytest.approx(ref, rel=1e-12, abs=0)


def test_loss_rejects_scores_that_overflow_once_divided_by_the_temperature():
    # finite scores / a tiny temperature = inf: the loss was NaN and the dual table kept
    # nu = inf for good
    loss_fn = EntropicRiskLoss(3, temperature=1e-10)
    with pytest.raises(ValueError, match="temperature"):
        loss_fn(torch.tensor([[1e30, 1.0]]), torch.tensor([1]))
    assert not bool(loss_fn.initialized.any()) and bool((loss_fn.nu == 0).all())
    with pytest.raises(ValueError, match="temperature"):  # tau beyond float32: inf * 0
        EntropicRiskLoss(1, temperature=1e39)(torch.zeros(1, 2), torch.tensor([0]))
    big = torch.tensor([[1e30, 1.0]], dtype=torch.float64, requires_grad=True)
    out = EntropicRiskLoss(1, temperature=1e-10)(big, torch.tensor([0]))  # float64 holds it
    assert math.isfinite(float(out.detach()))


def test_kldro_regressor_is_exactly_equivariant_to_power_of_two_target_units(regression):
    # y * 2^k with lam * 4^k is the same problem in other units: the float32 SGD now runs
    # on y over a power of two, so the fit is the same bit for bit; it raised "diverged"
    # for |y| ~ 1e21 (squared losses beyond float32) and lost digits for |y| ~ 1e-21
    X, y = regression
    kw = dict(epochs=3, batch_size=16, random_state=0)
    base = KLDRORegressor(lam=0.5, **kw).fit(X, y)
    for k in (70, -70):
        c = 2.0 ** k
        reg = KLDRORegressor(lam=0.5 * c * c, **kw).fit(X, y * c)
        np.testing.assert_array_equal(reg.coef_, base.coef_ * c)
        assert reg.intercept_ == base.intercept_ * c
        np.testing.assert_array_equal(reg.loss_curve_, np.asarray(base.loss_curve_) * c * c)
        assert reg.nu_ == base.nu_


@pytest.mark.parametrize("units", [1e-30, 1e30])
def test_kldro_and_pauc_fits_do_not_depend_on_feature_units(regression, units):
    # the least-squares warm start truncated the features (or the intercept) whose units
    # differ from 1 by ~1e16, and feature_scaling called a feature of std 1e-30 constant:
    # both estimators ignored such features, against the documented unit independence
    X, y = regression
    kw = dict(epochs=2, batch_size=16, random_state=0)
    base = KLDRORegressor(lam=1.0, **kw).fit(X, y)
    reg = KLDRORegressor(lam=1.0, **kw).fit(X * units, y)
    np.testing.assert_allclose(reg.coef_ * units, base.coef_, rtol=1e-5)
    assert reg.objective(X * units, y) == pytest.approx(base.objective(X, y), rel=1e-6)
    yb = (y > np.median(y)).astype(int)
    ref = PartialAUCClassifier(epochs=2, random_state=0).fit(X, yb)
    clf = PartialAUCClassifier(epochs=2, random_state=0).fit(X * units, yb)
    np.testing.assert_allclose(clf.coef_ * units, ref.coef_, rtol=1e-4, atol=1e-8)
    assert clf.score(X * units, yb) == pytest.approx(ref.score(X, yb), abs=1e-12)


def test_exact_objectives_at_a_huge_temperature_tend_to_the_mean_loss(regression):
    # lam (tau) far above the losses: lam log mean exp(l / lam) -> mean l, but the exact
    # objectives returned 0.0 at lam = 1e30
    X, y = regression
    reg = KLDRORegressor(lam=1.0, epochs=1, random_state=0).fit(X, y)
    ell = (reg.predict(X) - y) ** 2
    huge = reg.set_params(lam=1e30).objective(X, y)
    assert huge == pytest.approx(ell.mean() + ell.var() / 2e30, rel=1e-12)
    yb = (y > np.median(y)).astype(int)
    clf = PartialAUCClassifier(epochs=1, random_state=0).fit(X, yb)
    h = 1 / (1 + np.exp(-(X @ clf.coef_ + clf.intercept_)))
    pair = np.maximum(1 - (h[yb == 1][:, None] - h[yb == 0][None, :]), 0) ** 2
    assert clf.set_params(lam=1e30).objective(X, yb) == pytest.approx(pair.mean(), rel=1e-12)
    Xc, yc = X, np.digitize(y, np.quantile(y, [0.25, 0.5, 0.75]))
    xc = SCENTClassifier(loss="negatives", n_negatives=3, epochs=1, random_state=0).fit(Xc, yc)
    z = Xc @ xc.coef_.T + xc.intercept_
    diff = (z - z[np.arange(len(yc)), yc][:, None])[np.arange(4)[None, :] != yc[:, None]]
    assert xc.set_params(temperature=1e30).objective(Xc, yc) == pytest.approx(diff.mean(),
                                                                               rel=1e-10)


def test_out_of_range_lam_margin_and_temperature_raise_clear_errors(regression):
    # each one failed with "diverged at epoch 1; lower lr" (a NaN first step)
    X, y = regression
    for lam, word in ((1e-300, "too small"), (1e300, "too large")):
        with pytest.raises(ValueError, match=f"lam=.*{word}"):
            KLDRORegressor(lam=lam, epochs=1, random_state=0).fit(X, y)
    yb = (y > np.median(y)).astype(int)
    for kw in (dict(lam=1e-300), dict(lam=1e300), dict(margin=1e30)):
        with pytest.raises(ValueError, match="margin=.*float32"):
            PartialAUCClassifier(epochs=1, random_state=0, **kw).fit(X, yb)
    with pytest.raises(ValueError, match="temperature must be at most"):
        SCENTClassifier(n_negatives=1, temperature=1e300, epochs=1).fit(X, yb)


def test_asgd_dual_overflow_is_named_in_the_divergence_error():
    # ASGD's exp(L - nu) overflows to nu = inf when a batch's L jumps ~900 above nu (an
    # outlier after a low first visit); the error now says so instead of "lower lr"
    y = np.zeros(8)
    y[5] = 60.0
    X = np.arange(8.0)[:, None]
    with pytest.raises(FloatingPointError, match="diverged.*dual update overflowed"):
        KLDRORegressor(lam=1.0, method="asgd", batch_size=1, epochs=1, lr=1e-9,
                       lr_schedule="constant", random_state=0).fit(X, y)


def test_pauc_objective_of_a_single_class_raises_a_clear_error():
    # it failed with "math domain error" (a log of zero negatives)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(int)
    clf = PartialAUCClassifier(epochs=1, random_state=0).fit(X, y)
    for only in (0, 1):
        with pytest.raises(ValueError, match="both classes"):
            clf.objective(X, np.full(40, only))


def test_in_batch_negatives_with_batches_of_one_raise():
    # a batch of one sample holds no other class: every anchor was skipped, the model
    # stayed at zero and loss_curve_ was all NaN, without a word
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(10, 2)), np.arange(10) % 2
    with pytest.raises(ValueError, match="batch_size must be >= 2"):
        SCENTClassifier(negatives="in_batch", batch_size=1, epochs=1).fit(X, y)
    clf = SCENTClassifier(negatives="in_batch", batch_size=2, epochs=2, random_state=0)
    assert np.isfinite(clf.fit(X, y).loss_curve_).all()
