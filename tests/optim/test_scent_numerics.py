"""SCENT at extreme scales: temperatures, targets, feature units, float32 range limits.

Each test pins a failure found by the numerical-robustness audit (session 11): a NaN or
inf returned silently, a wrong exact objective, or a misleading error.
"""

import math

import numpy as np
import pytest
import torch

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
    objective,
    softplus_dual_ratio,
)
from mlpapers.optim.scent._kernels import log_mean_exp, tempered_log_mean_exp

# multiprecision references; mpmath comes with torch (through sympy) but no extra lists it
mpmath = pytest.importorskip("mpmath")


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
    # an alpha beyond float32 failed at the first step (SCENTClassifier) or returned NaN
    # coefficients (the KL-DRO fits, without an error when epochs=1)
    for est, target in [(SCENTClassifier(n_negatives=1, epochs=1), yb),
                        (KLDRORegressor(epochs=1, random_state=0), y),
                        (KLDROClassifier(epochs=1, random_state=0), yb)]:
        with pytest.raises(ValueError, match=r"^alpha must be at most 3.4e\+38"):
            est.set_params(alpha=1e39).fit(X, target)
    # the last step's NaN weights reached no later batch's check: one full-batch epoch at
    # a huge lr returned NaN coefficients without an error
    with pytest.raises(FloatingPointError, match="diverged at epoch 1: the objective is nan"):
        KLDRORegressor(lr=1e38, epochs=1, batch_size=len(y), random_state=0).fit(X, y)


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


def test_tempered_log_mean_exp_keeps_its_digits_with_one_item_far_below_the_max():
    # log1p(mean(expm1(d))) was chosen only when every item lay within 0.5 of the max: one
    # item at -tau sent the slice to log-sum-exp, whose log of a value near 1 kept
    # ~1e-10 of it. The error left is that of summing the values in float64
    # (eps * mean |v|), whatever the temperature
    tau, k = 1e6, 20000
    gen = torch.Generator().manual_seed(0)
    v = torch.rand(k, generator=gen, dtype=torch.float64) * 0.01 * tau - 0.005 * tau
    v = torch.cat([v, torch.tensor([-tau], dtype=torch.float64)])
    ref = _reference(v, tau, dps=40)
    err = abs(float(tempered_log_mean_exp(v, tau)) - ref)
    assert err <= 16 * torch.finfo(torch.float64).eps * float(v.abs().mean())


@pytest.mark.parametrize("tau", [0.3, 30.0, 3e3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_objective_of_narrow_float_scores_is_correctly_rounded(tau, dtype):
    # the plain-form switch (|plain| < 2e-4 log k) suits float64 only, and the shifted
    # form c + tau log(...) cancels when the value is far below max |v|: float32
    # objective() of randn scores at tau = 30 was off by ~4e-5. Narrow floats are now
    # reduced in float64: the result is the reference rounded to the dtype
    v = torch.randn(3, 300, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = objective(v, temperature=tau)
    assert got.dtype == dtype
    ref = np.mean([_reference(row, tau, dps=40) for row in v.double()])
    assert float(got) == pytest.approx(ref, rel=torch.finfo(dtype).eps, abs=0)
    g = torch.Generator().manual_seed(2)
    rows = torch.randn(4, 300, generator=g).to(dtype)  # per slice too (dim, mask)
    mask = torch.rand(4, 300, generator=g) < 0.7
    got = tempered_log_mean_exp(rows.T, tau, dim=0, mask=mask.T)
    for i in range(4):
        ref = _reference(rows[i][mask[i]].double(), tau, dps=40)
        assert float(got[i]) == pytest.approx(ref, rel=torch.finfo(dtype).eps, abs=0)


def test_a_huge_constant_feature_column_is_ignored_not_diverged():
    # with an intercept, the float64 mean of a column of 1e20 (n = 101) is off by an ulp:
    # X - mu was a constant 16384 that feature_scaling left at scale 1, so the float32
    # SGD saw a feature of curvature 16384^2 and raised "diverged"; a constant column is
    # now exactly 0 in every standardised design, as if the column were absent
    rng = np.random.default_rng(0)
    X = rng.standard_normal((101, 2))
    y = X @ [1.0, -2.0] + rng.standard_normal(101)
    Xc = np.c_[X, np.full(101, 1e20)]
    assert Xc[:, 2].mean() != 1e20          # the premise: an inexact float64 mean
    yb = (y > 0).astype(int)
    kw = dict(lam=1.0, epochs=3, random_state=0)
    for est, target in ((KLDRORegressor(alpha=0.0, **kw), y),
                        (KLDRORegressor(alpha=0.1, **kw), y),
                        (KLDROClassifier(**kw), yb),
                        (PartialAUCClassifier(epochs=3, random_state=0), yb)):
        with_col = est.fit(Xc, target)
        coef_c = np.atleast_2d(with_col.coef_)
        assert (coef_c[:, 2] == 0).all()
        without = type(est)(**est.get_params()).fit(X, target)
        np.testing.assert_allclose(coef_c[:, :2], np.atleast_2d(without.coef_), rtol=1e-6)
        np.testing.assert_allclose(with_col.intercept_, without.intercept_, rtol=1e-6,
                                   atol=1e-12)


def test_pauc_rejects_every_margin_and_lam_that_overflow_float32():
    # these passed the range check, then failed mid-fit with "scores contain NaN or
    # infinity" ((margin + 1)^2 beyond float32 whatever lam) or "the dual update
    # overflowed" under SCENT (whose dual step cannot overflow: the surrogate's mean of
    # nu ~ loss / lam over the batch did)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 3))
    y = (X[:, 0] > 0).astype(int)
    for margin, lam in ((1e20, 1e30), (1e19, 1.0), (1.0, 3e-38)):
        with pytest.raises(ValueError, match="margin=.*float32"):
            PartialAUCClassifier(margin=margin, lam=lam, epochs=1, random_state=0).fit(X, y)
    # just inside the documented bounds the fit runs, for every method with a safe dual
    big = float(torch.finfo(torch.float32).max)
    bs = 32
    for margin, lam in ((1.0, 4 / (big / (2 * bs)) * 1.01),
                        (math.sqrt(big) * 0.999 - 1, 1e38)):
        for method in ("scent", "sox", "umax", "bsgd"):
            clf = PartialAUCClassifier(margin=margin, lam=lam, method=method, epochs=2,
                                       batch_size=bs, random_state=0).fit(X, y)
            assert np.isfinite(clf.loss_curve_).all() and np.isfinite(clf.coef_).all()


def test_surrogate_overflow_names_the_dual_update_only_for_asgd():
    # a non-finite surrogate was reported as "the dual update overflowed" for every
    # method, but only ASGD's exp(L - nu) step can overflow
    from mlpapers.optim.scent._common import surrogate_overflow

    for method in ("asgd", "asgd_softplus"):
        msg = str(surrogate_overflow("KLDRORegressor", method, 2, "loss / lam"))
        assert "dual update overflowed" in msg and "epoch 2" in msg
    for method in ("scent", "sox", "umax", "bsgd"):
        msg = str(surrogate_overflow("SCENTClassifier", method, 1, "score / temperature"))
        assert "dual update" not in msg
        assert "score / temperature too large" in msg and "raise temperature" in msg


def test_log_mean_exp_counts_a_broadcast_mask_as_broadcast():
    # a (B, 1) mask was broadcast by masked_fill but counted before broadcasting: the
    # count was 1 instead of k and the result log k too high (a log-sum-exp), silently
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, generator=g, dtype=torch.float64)
    full = log_mean_exp(s, mask=torch.ones(3, 5, dtype=torch.bool))
    assert torch.allclose(log_mean_exp(s, mask=torch.ones(3, 1, dtype=torch.bool)), full)
    assert torch.allclose(full, torch.log(torch.exp(s).mean(-1)))
    cols = torch.tensor([True, False, True, True, False])
    ref = torch.log(torch.exp(s[:, cols]).mean(-1))
    assert torch.allclose(log_mean_exp(s, mask=cols), ref)  # (k,) broadcasts over rows
    rows = torch.tensor([[True], [False], [True]])
    got = log_mean_exp(s, dim=0, mask=rows)
    assert torch.allclose(got, torch.log(torch.exp(s[[0, 2]]).mean(0)))


def test_log_mean_exp_refuses_a_mask_that_does_not_broadcast_and_a_0d_score():
    with pytest.raises(ValueError, match=r"mask of shape \(2,\) does not broadcast"):
        log_mean_exp(torch.zeros(2, 3), mask=torch.tensor([True, False]))
    with pytest.raises(ValueError, match="at least one dimension"):
        log_mean_exp(torch.tensor(1.0))
    with pytest.raises(TypeError, match="dim must be an int"):
        log_mean_exp(torch.zeros(2, 3), dim=(0, 1))
    assert float(log_mean_exp(torch.zeros(2, 3), dim=np.int64(0))[0]) == 0.0


@pytest.mark.parametrize("tau", [1.0, 1e6])
def test_objective_counts_a_broadcast_mask_as_broadcast_at_every_temperature(tau):
    # the accurate path of a large temperature counted a (n, 1) mask as one item per
    # row (-3.61 instead of -0.26 here, silently) and a (1, m) mask failed in indexing
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 4, generator=g, dtype=torch.float64)
    full = objective(s, temperature=tau)
    assert torch.allclose(objective(s, mask=torch.ones(3, 1, dtype=torch.bool),
                                    temperature=tau), full, rtol=1e-12, atol=0)
    cols = torch.tensor([[True, False, True, True]])
    ref = objective(s[:, [0, 2, 3]], temperature=tau)
    for mask in (cols, cols.expand(3, 4), cols.double(), cols.long()):
        assert torch.allclose(objective(s, mask=mask, temperature=tau), ref,
                              rtol=1e-12, atol=0)
    # tau -> infinity: the mean of the kept scores, whatever the mask's shape
    if tau > 1e3:
        assert math.isclose(float(ref), float(s[:, [0, 2, 3]].mean()), rel_tol=1e-5)


@pytest.mark.parametrize("values", [0.5, float("nan"), 2.0])
def test_a_mask_that_is_not_zero_or_one_is_refused_not_read_as_true(values):
    # a mask selects items: 0.5 (a weight?), NaN or 2 were silently read as True
    s = torch.zeros(2, 3)
    mask = torch.full((2, 3), values)
    with pytest.raises(ValueError, match="log_mean_exp: mask must be boolean or hold only 0"):
        log_mean_exp(s, mask=mask)
    with pytest.raises(ValueError, match="objective: mask must be boolean or hold only 0"):
        objective(s, mask=mask)
    with pytest.raises(ValueError, match="mask must be boolean or hold only 0"):
        EntropicRiskLoss(2)(s, torch.arange(2), mask=mask)
    with pytest.raises(ValueError, match="softplus_dual_ratio: mask must be boolean"):
        softplus_dual_ratio(s, torch.zeros(2), rho=1.0, mask=mask)
    # (refused by the public kernels' tensor check, before the mask's own)
    with pytest.raises(TypeError, match="log_mean_exp: mask must hold real numbers"):
        log_mean_exp(s, mask=torch.ones(2, 3, dtype=torch.complex64))
