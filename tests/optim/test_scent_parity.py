"""Parity between SCENT code paths that claim to agree.

Each test names the two paths it compares: the estimators' vectorised steps against
float64 references written from the definitions, fit against partial_fit, the sparse
against the dense paths, and the exact objective against the training curve.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.special import logsumexp

from mlpapers.optim.scent import (
    METHODS,
    EntropicRiskLoss,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
)


def _xc_data(seed: int, n: int = 40, d: int = 4, C: int = 5):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = rng.integers(0, C, n)
    y[:C] = np.arange(C)
    return X, y


# -- PartialAUCClassifier ---------------------------------------------------------------
def test_pauc_fit_does_not_depend_on_feature_offset():
    """fit(X) vs fit(X + offset): the documented offset invariance (regression: X was
    rounded to float32 before centring, so an offset of 1e7 changed coef_ by 10%)."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 3))
    y = (X[:, 0] + rng.standard_normal(120) > 0).astype(int)
    ref = PartialAUCClassifier(epochs=3, random_state=0).fit(X, y)
    for offset in (1e4, 1e7):
        shifted = PartialAUCClassifier(epochs=3, random_state=0).fit(X + offset, y)
        np.testing.assert_allclose(shifted.coef_, ref.coef_, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(shifted.loss_curve_, ref.loss_curve_, rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pauc_loss_curve_is_the_objective(seed):
    """loss_curve_[-1] (exact training objective after the last epoch) vs objective(X, y)
    on the training data, including a constant column and a large offset."""
    rng = np.random.default_rng(seed)
    n, d = (15, 60, 90)[seed], (1, 3, 4)[seed]
    X = rng.standard_normal((n, d)) * rng.lognormal(size=d) + rng.standard_normal(d) * 1e3
    if d > 2:
        X[:, 1] = 7.0
    y = np.where(X[:, 0] > np.median(X[:, 0]), "pos", "neg")
    clf = PartialAUCClassifier(epochs=2, batch_size=4, n_negatives=3, lam=0.5,
                               random_state=seed).fit(X, y)
    assert clf.loss_curve_[-1] == pytest.approx(clf.objective(X, y), rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_pauc_with_every_sample_per_step_is_exact_gradient_descent(seed):
    """batch_size = n_pos and n_negatives = n_neg with BSGD: every step sees every pair
    (the negatives used to be drawn with replacement: 8 of 8 held repeats, and the
    "full-batch" fit was noisy SGD that ended above its start)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((12, 2))
    X = (X - X.mean(0)) / X.std(0)  # the estimator's preconditioner is then the identity
    y = np.r_[np.ones(4), np.zeros(8)].astype(int)
    lam, margin, lr, steps = 0.5, 1.0, 0.5, 5
    clf = PartialAUCClassifier(lam=lam, margin=margin, method="bsgd", lr=lr, momentum=0.0,
                               lr_schedule="constant", epochs=steps, batch_size=4,
                               n_negatives=8, random_state=seed).fit(X, y)
    Xt = torch.tensor(X)
    w = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    curve = []
    for _ in range(steps):
        h = torch.sigmoid(Xt @ w)
        ell = torch.clamp(margin - (h[:4, None] - h[None, 4:]), min=0) ** 2 / lam
        f = lam * (torch.logsumexp(ell, 1) - np.log(8)).mean()
        (g,) = torch.autograd.grad(f, [w])
        with torch.no_grad():
            w -= lr * g
            h = torch.sigmoid(Xt @ w)
            ell = torch.clamp(margin - (h[:4, None] - h[None, 4:]), min=0) ** 2 / lam
            curve.append(float(lam * (torch.logsumexp(ell, 1) - np.log(8)).mean()))
    np.testing.assert_allclose(clf.loss_curve_, curve, rtol=1e-5)
    np.testing.assert_allclose(clf.coef_, w.detach().numpy(), rtol=1e-4, atol=1e-6)
    assert np.all(np.diff(clf.loss_curve_) < 0)


# -- SCENTClassifier --------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(), dict(fit_intercept=True, momentum=0.5),
                                dict(method="sox"), dict(method="umax", lr=0.05),
                                dict(loss="negatives", negatives="in_batch", lr=0.1)])
def test_fit_constant_schedule_equals_partial_fit_epochs(kw):
    """fit(epochs=3, lr_schedule="constant") vs three partial_fit calls (the second
    through a pickle): same random stream, same weights, duals and curve."""
    import pickle

    X, y = _xc_data(0)
    base = {**dict(n_negatives=2, batch_size=7, lr=0.5, random_state=3,
                   lr_schedule="constant"), **kw}
    full = SCENTClassifier(epochs=3, **base).fit(X, y)
    part = SCENTClassifier(epochs=3, **base).partial_fit(X, y, classes=np.unique(y))
    part = pickle.loads(pickle.dumps(part)).partial_fit(X, y).partial_fit(X, y)
    np.testing.assert_allclose(part.coef_, full.coef_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(part.intercept_, full.intercept_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(part.nu_, full.nu_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(part.loss_curve_, full.loss_curve_, rtol=1e-6)


@pytest.mark.parametrize("loss", ["softmax", "negatives"])
def test_row_sparse_step_equals_dense_step_and_sparse_X(loss):
    """The row-sparse SGD step (alpha=0) vs the dense-gradient step (alpha=1e-30, a
    penalty below float32 resolution), and dense X vs scipy CSR X."""
    X, y = _xc_data(1)
    kw = dict(loss=loss, n_negatives=3, batch_size=6, epochs=3, lr=0.3, random_state=0,
              fit_intercept=True)
    sparse_step = SCENTClassifier(**kw).fit(X, y)
    dense_step = SCENTClassifier(alpha=1e-30, **kw).fit(X, y)
    csr = SCENTClassifier(**kw).fit(sp.csr_matrix(X), y)
    np.testing.assert_allclose(dense_step.coef_, sparse_step.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(csr.coef_, sparse_step.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(csr.intercept_, sparse_step.intercept_, rtol=1e-5, atol=1e-6)


def _gd_reference(X, y, C, loss, tau, alpha, momentum, lr, epochs):
    """Full-batch heavy-ball GD in float64 on the exact risk of ``loss`` (definition)."""
    n, d = X.shape
    W = torch.zeros(C, d, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(C, dtype=torch.float64, requires_grad=True)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    opt = torch.optim.SGD([W, b], lr=lr, momentum=momentum)
    for _ in range(epochs):
        z = (Xt @ W.T + b) / tau
        pos = z[torch.arange(n), yt]
        if loss == "softmax":
            risk = torch.logsumexp(z, 1) - pos
        else:
            diff = (z - pos[:, None]).masked_fill(
                torch.nn.functional.one_hot(yt, C).bool(), float("-inf"))
            risk = torch.logsumexp(diff, 1) - np.log(C - 1)
        opt.zero_grad()
        (tau * risk.mean() + 0.5 * alpha * (W * W).sum()).backward()
        opt.step()
    return W.detach().numpy(), b.detach().numpy()


@pytest.mark.parametrize("loss,tau,alpha,momentum", [("softmax", 1.0, 0.0, 0.0),
                                                     ("softmax", 0.5, 0.1, 0.5),
                                                     ("negatives", 0.7, 0.0, 0.0),
                                                     ("negatives", 1.0, 0.05, 0.3)])
def test_bsgd_with_every_class_is_exact_gradient_descent(loss, tau, alpha, momentum):
    """SCENTClassifier(method="bsgd", n_negatives=C-1, batch_size=n) vs full-batch GD in
    float64 on the exact risk (the docstring: "bsgd is then exact mini-batch SGD")."""
    X, y = _xc_data(2, n=30)
    C = 5
    clf = SCENTClassifier(method="bsgd", loss=loss, n_negatives=C - 1, batch_size=len(y),
                          epochs=4, lr=0.3, lr_schedule="constant", temperature=tau,
                          alpha=alpha, momentum=momentum, fit_intercept=True,
                          random_state=0).fit(X, y)
    W, b = _gd_reference(X, y, C, loss, tau, alpha, momentum, 0.3, 4)
    np.testing.assert_allclose(clf.coef_, W, atol=1e-6)
    np.testing.assert_allclose(clf.intercept_, b, atol=1e-6)


@pytest.mark.parametrize("loss", ["softmax", "negatives"])
def test_scent_first_visit_step_equals_bsgd_step(loss):
    """method="scent" vs method="bsgd" for one full-batch epoch with every class: at the
    first visit nu = L, so SCENT's primal weights exp(s - nu) are the softmax weights of
    the plug-in gradient."""
    X, y = _xc_data(3, n=25)
    kw = dict(loss=loss, n_negatives=4, batch_size=len(y), epochs=1, lr=0.4,
              fit_intercept=True, random_state=0)
    scent = SCENTClassifier(method="scent", **kw).fit(X, y)
    bsgd = SCENTClassifier(method="bsgd", **kw).fit(X, y)
    np.testing.assert_allclose(scent.coef_, bsgd.coef_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(scent.intercept_, bsgd.intercept_, rtol=1e-6, atol=1e-7)


# -- EntropicRiskLoss -------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("B,k", [(1, 1), (6, 5)])
def test_masked_batch_equals_per_anchor_loop(method, B, k):
    """One masked (B, k) call vs B single-anchor calls on the ragged rows: same dual
    table, same value (the mean) and same gradient (divided by B)."""
    rng = np.random.default_rng(B * 10 + k)
    kw = dict(method=method, log_alpha=0.3, temperature=0.7, gamma=0.6, dual_lr=0.2,
              delta=0.5)
    s0 = torch.as_tensor(rng.standard_normal((B, k)) * 2)
    mask = torch.as_tensor(rng.random((B, k)) < 0.6)
    mask[:, 0] = True
    idx = torch.as_tensor(rng.permutation(12)[:B])

    def warmed():
        loss_fn = EntropicRiskLoss(12, **kw)
        g = torch.Generator().manual_seed(0)
        for _ in range(2):
            loss_fn(torch.randn(B, k, generator=g, dtype=torch.float64), idx)
        return loss_fn

    batch_fn, loop_fn = warmed(), warmed()
    s = s0.clone().requires_grad_()
    value = batch_fn(s, idx, mask)
    value.backward()
    grads, values = torch.zeros_like(s0), []
    for i in range(B):
        si = s0[i][mask[i]][None].clone().requires_grad_()
        vi = loop_fn(si, idx[i:i + 1])
        vi.backward()
        grads[i][mask[i]] = si.grad[0] / B
        values.append(float(vi.detach()))
    torch.testing.assert_close(batch_fn.nu, loop_fn.nu, rtol=1e-12, atol=1e-12)
    assert float(value.detach()) == pytest.approx(np.mean(values), rel=1e-10, abs=1e-12)
    torch.testing.assert_close(s.grad, grads, rtol=1e-10, atol=1e-12)


# -- KL-DRO estimators ------------------------------------------------------------------
@pytest.mark.parametrize("alpha,fit_intercept", [(0.0, True), (0.3, True), (0.3, False)])
def test_kldro_regressor_erm_start_and_scaling_round_trip(alpha, fit_intercept):
    """init_objective_ vs the float64 ridge normal equations (penalty alpha/2 ||W||^2 on
    the mean squared loss), and a fit with lr ~ 0 vs its start: the standardise/unscale
    round trip (with the power-of-two target rescale for y ~ 2^40) keeps the ERM model."""
    rng = np.random.default_rng(4)
    n, d, lam = 40, 3, 2.0
    X = rng.standard_normal((n, d)) * [1.0, 30.0, 0.01] + [5.0, -200.0, 0.0]
    y = X @ rng.standard_normal(d) + rng.standard_t(3, n)
    A = np.c_[X, np.ones(n)] if fit_intercept else X
    P = np.eye(A.shape[1]) * (n * alpha / 2)
    if fit_intercept:
        P[-1, -1] = 0.0
    w = np.linalg.solve(A.T @ A + P, A.T @ y)
    coef = w[:d]
    ell = (A @ w - y) ** 2
    ref = lam * (logsumexp(ell / lam) - np.log(n)) + 0.5 * alpha * (coef ** 2).sum()
    kw = dict(lam=lam, alpha=alpha, fit_intercept=fit_intercept, epochs=1, batch_size=8,
              random_state=0)
    reg = KLDRORegressor(lr=1e-30, **kw).fit(X, y)
    assert reg.init_objective_ == pytest.approx(ref, rel=1e-8)
    # (the SGD holds the parameters in float32: the stored start is rounded to it)
    assert reg.objective(X, y) == pytest.approx(reg.init_objective_, rel=1e-5)
    np.testing.assert_allclose(reg.coef_, coef, rtol=1e-5, atol=1e-8)
    if alpha == 0.0:
        c = 2.0 ** 40
        big = KLDRORegressor(lr=1e-30, **{**kw, "lam": lam * c * c}).fit(X, y * c)
        np.testing.assert_allclose(big.predict(X) / c, reg.predict(X), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_kldro_classifier_lr_zero_keeps_the_erm_start(n_classes):
    """KLDROClassifier with lr ~ 0 vs its ERM start: objective(X, y) == init_objective_,
    and objective vs the float64 formula from predict_proba."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((60, 3)) * [1.0, 50.0, 1e-3] + [0.0, 1e3, 3.0]
    y = rng.integers(0, n_classes, 60)
    clf = KLDROClassifier(lam=0.8, lr=1e-30, epochs=1, random_state=0).fit(X, y)
    # (the SGD holds the parameters in float32: the stored start is rounded to it)
    assert clf.objective(X, y) == pytest.approx(clf.init_objective_, rel=1e-5)
    ell = -np.log(clf.predict_proba(X)[np.arange(60), y])
    ref = 0.8 * (logsumexp(ell / 0.8) - np.log(60)) + 0.5 * clf.alpha * (clf.coef_ ** 2).sum()
    assert clf.objective(X, y) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("est", ["KLDRORegressor", "KLDROClassifier", "PartialAUCClassifier",
                                 "SCENTClassifier"])
def test_dual_rules_at_their_plug_in_limit_equal_bsgd(est):
    """method="sox" with gamma=1 and method="scent" with alpha -> inf (log_alpha=60) vs
    method="bsgd" in each estimator: both set nu := L every step, so the primal weights
    exp(s - nu) are the plug-in softmax weights and the iterates agree."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((40, 3))
    t = X @ np.array([1.0, -2.0, 0.5]) + rng.standard_t(3, 40)
    Est, y, kw = {
        "KLDRORegressor": (KLDRORegressor, t, dict(lr=1e-3)),
        "KLDROClassifier": (KLDROClassifier, (t > 0).astype(int), dict(lr=1e-2)),
        "PartialAUCClassifier": (PartialAUCClassifier, (t > 0).astype(int), dict()),
        "SCENTClassifier": (SCENTClassifier, rng.integers(0, 6, 40),
                            dict(n_negatives=3, batch_size=8)),
    }[est]
    kw = dict(epochs=2, random_state=0, **kw)
    bsgd = Est(method="bsgd", **kw).fit(X, y)
    sox = Est(method="sox", gamma=1.0, **kw).fit(X, y)
    scent = Est(method="scent", log_alpha=60.0, **kw).fit(X, y)
    np.testing.assert_allclose(sox.coef_, bsgd.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scent.coef_, bsgd.coef_, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", [1e160, 1e-160])
def test_dro_and_pauc_fits_at_extreme_feature_scales_equal_the_unit_scale_fit(scale):
    """fit(X) vs fit(X * s) for s far beyond float64's squared range: the same model in
    the new units (coef_ / s). Regression: the per-column spread was squared in
    float64, overflowed above ~1e154, and PartialAUCClassifier silently returned an
    all-zero model (the KL-DRO estimators a misleading "lam too small" error). The
    KL-DRO fits use alpha=0: an L2 penalty in the original units is not scale-free."""
    from mlpapers.optim import KLDROClassifier, KLDRORegressor, PartialAUCClassifier

    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 3))
    y_cls = (X[:, 0] + 0.3 * rng.standard_normal(80) > 0).astype(int)
    y_reg = X[:, 0] + 0.1 * rng.standard_normal(80)
    for est, y in ((PartialAUCClassifier(epochs=3, random_state=0), y_cls),
                   (KLDROClassifier(alpha=0.0, random_state=0), y_cls),
                   (KLDRORegressor(alpha=0.0, random_state=0), y_reg)):
        ref = np.ravel(est.fit(X, y).coef_)
        got = np.ravel(est.fit(X * scale, y).coef_) * scale
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-9 * np.abs(ref).max())
