"""SCENT: properties that must hold for every valid input, on inputs hypothesis generates.

Relations (kernels): the SPMD and SOX steps are convex combinations in ``e^nu`` space
(the new ``nu`` lies between the old one and ``L`` and is monotone in both);
``log_mean_exp`` is permutation- and duplication-invariant, shift-equivariant and
bounded by ``max - log k <= lme <= max``; the exact ``objective`` is invariant to
permuting anchors and positively homogeneous in (scores, temperature). The
:class:`EntropicRiskLoss` of every method is equivariant to permuting the batch
(value, dual table, score gradients) and invariant to permuting items, and a batch
equals its two halves (per-anchor duals; the loss is a mean over anchors).
Estimators: outputs are mutually consistent (predict / predict_proba / log-proba /
decision_function / score), ``objective`` equals its documented formula from the
fitted parameters, a monotone relabelling of ``y`` and the memory layout of ``X``
cannot change the fit, and the KL-DRO objective lies between the mean and the max
loss and does not increase with ``lam``.

``PROP_EXAMPLES`` raises the number of examples when exploring locally.
"""

import math
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import logsumexp, softmax

from mlpapers.optim.scent import (
    METHODS,
    EntropicRiskLoss,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    SCENTClassifier,
    log_mean_exp,
    objective,
    sox_update,
    spmd_update,
)

N = int(os.environ.get("PROP_EXAMPLES", 15))
prop = settings(max_examples=N, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
f64 = torch.float64
finite = dict(allow_nan=False, allow_infinity=False)


def t(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


# scores at several scales: unit-size, large (1e3) and integer-valued (ties)
scales = st.sampled_from([1.0, 30.0, 1e3])


@st.composite
def score_matrix(draw, max_b=6, max_k=7):
    b = draw(st.integers(1, max_b))
    k = draw(st.integers(1, max_k))
    scale = draw(scales)
    integer = draw(st.booleans())
    elems = (st.integers(-5, 5).map(float) if integer
             else st.floats(-1.0, 1.0, **finite))
    s = draw(hnp.arrays(np.float64, (b, k), elements=elems))
    return s * scale


# -- kernels -------------------------------------------------------------------------
# The SPMD step is e^nu' = (1 - g) e^nu + g e^L with g in (0, 1); both the betweenness and
# the monotonicity are exact in real arithmetic; the tolerance is a few ulps of the inputs.
@given(st.floats(-1e3, 1e3, **finite), st.floats(-1e3, 1e3, **finite),
       st.floats(-60, 60, **finite), st.floats(0, 50, **finite))
@prop
def test_spmd_step_is_between_nu_and_L_and_monotone_in_both(nu, L, log_alpha, bump):
    tol = 1e-12 * (1 + abs(nu) + abs(L))
    new = float(spmd_update(t([nu]), t([L]), log_alpha)[0])
    assert min(nu, L) - tol <= new <= max(nu, L) + tol
    # a larger mini-batch estimate, or a larger previous dual, never lowers the new dual
    assert float(spmd_update(t([nu]), t([L + bump]), log_alpha)[0]) >= new - tol
    assert float(spmd_update(t([nu + bump]), t([L]), log_alpha)[0]) >= new - tol
    # a fixed point: nu = L stays there for every alpha
    assert float(spmd_update(t([L]), t([L]), log_alpha)[0]) == pytest.approx(L, abs=tol)


@given(st.floats(-1e3, 1e3, **finite), st.floats(-1e3, 1e3, **finite),
       st.floats(1e-6, 1.0, **finite))
@prop
def test_sox_step_is_between_nu_and_L(nu, L, gamma):
    tol = 1e-12 * (1 + abs(nu) + abs(L))
    new = float(sox_update(t([nu]), t([L]), gamma)[0])
    assert min(nu, L) - tol <= new <= max(nu, L) + tol
    if gamma == 1.0:
        assert new == L


@given(score_matrix(), st.randoms(use_true_random=False), st.integers(1, 3),
       st.floats(-1e3, 1e3, **finite))
@prop
def test_log_mean_exp_permutation_duplication_shift_and_bounds(s, rnd, reps, c):
    ref = logsumexp(s, axis=1) - math.log(s.shape[1])
    got = log_mean_exp(t(s)).numpy()
    tol = 1e-12 * (1 + np.abs(s).max() + abs(c))
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
    perm = list(range(s.shape[1]))
    rnd.shuffle(perm)
    np.testing.assert_allclose(log_mean_exp(t(s[:, perm])).numpy(), got, rtol=0, atol=tol)
    # repeating every item the same number of times leaves a mean unchanged
    np.testing.assert_allclose(log_mean_exp(t(np.tile(s, reps))).numpy(), got, rtol=0,
                               atol=tol)
    np.testing.assert_allclose(log_mean_exp(t(s + c)).numpy(), got + c, rtol=0, atol=tol)
    mx = s.max(axis=1)
    assert np.all(got <= mx + tol) and np.all(got >= mx - math.log(s.shape[1]) - tol)
    # an all-True mask is no mask; a float32 copy agrees to float32 precision of the inputs
    full = torch.ones(s.shape, dtype=torch.bool)
    np.testing.assert_allclose(log_mean_exp(t(s), mask=full).numpy(), got, rtol=0, atol=tol)
    got32 = log_mean_exp(torch.as_tensor(s, dtype=torch.float32)).double().numpy()
    np.testing.assert_allclose(got32, got, rtol=0, atol=1e-6 * (1 + np.abs(s).max()))


@given(score_matrix(), st.randoms(use_true_random=False), st.floats(0.05, 20, **finite),
       st.floats(0.1, 10, **finite))
@prop
def test_objective_anchor_permutation_and_homogeneity(s, rnd, tau, c):
    base = float(objective(t(s), temperature=tau))
    perm = list(range(s.shape[0]))
    rnd.shuffle(perm)
    tol = 1e-12 * (1 + np.abs(s).max() / tau) * tau * c
    assert float(objective(t(s[perm]), temperature=tau)) == pytest.approx(base, abs=tol)
    # F(c s; c tau) = c F(s; tau): the temperature is a unit of the scores
    assert float(objective(t(c * s), temperature=c * tau)) == pytest.approx(c * base,
                                                                           abs=10 * tol)
    ref = tau * np.mean(logsumexp(s / tau, axis=1) - math.log(s.shape[1]))
    assert base == pytest.approx(ref, abs=10 * tol)


# -- EntropicRiskLoss ------------------------------------------------------------------
def _loss(method, n, nu_init=None):
    return EntropicRiskLoss(n, method=method, log_alpha=0.3, temperature=0.7, gamma=0.6,
                            dual_lr=0.2, delta=0.5, rho=0.05, nu_init=nu_init)


def _run(method, batches, n, nu_init=None):
    """Values, score gradients and the final dual table of a sequence of calls."""
    fn = _loss(method, n, nu_init)
    values, grads = [], []
    for s, idx in batches:
        st_ = t(s).requires_grad_(True)
        value = fn(st_, torch.as_tensor(idx))
        value.backward()
        values.append(float(value.detach()))
        grads.append(st_.grad.numpy())
    return values, grads, fn.nu.clone(), fn.initialized.clone()


@st.composite
def loss_case(draw):
    s1 = draw(score_matrix(max_b=5, max_k=5))
    b, k = s1.shape
    # a second visit of the same anchors (the dual update of a visited anchor is exercised)
    s2 = draw(hnp.arrays(np.float64, (b, k), elements=st.floats(-1, 1, **finite)))
    n = draw(st.integers(b, b + 3))
    idx = draw(st.permutations(range(n)))[:b]
    return s1, s2 * draw(scales), np.asarray(idx), n


@given(loss_case(), st.sampled_from(METHODS), st.sampled_from([None, 0.5]),
       st.randoms(use_true_random=False))
@prop
def test_loss_is_equivariant_to_batch_order_and_invariant_to_item_order(case, method,
                                                                        nu_init, rnd):
    s1, s2, idx, n = case
    b, k = s1.shape
    vals, grads, nu, init = _run(method, [(s1, idx), (s2, idx)], n, nu_init)
    rows = list(range(b))
    rnd.shuffle(rows)
    cols = list(range(k))
    rnd.shuffle(cols)
    p_vals, p_grads, p_nu, p_init = _run(
        method, [(s1[rows][:, cols], idx[rows]), (s2[rows][:, cols], idx[rows])], n, nu_init)
    scale = 1 + max(np.abs(s1).max(), np.abs(s2).max()) / 0.7
    np.testing.assert_allclose(p_vals, vals, rtol=1e-10, atol=1e-10 * scale)
    for g, pg in zip(grads, p_grads):
        np.testing.assert_allclose(pg, g[rows][:, cols], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p_nu.numpy(), nu.numpy(), rtol=0, atol=1e-12 * scale)
    assert torch.equal(p_init, init)


@given(loss_case(), st.sampled_from(METHODS), st.integers(1, 4))
@prop
def test_a_batch_equals_its_two_halves(case, method, cut):
    s1, s2, idx, n = case
    b = s1.shape[0]
    cut = min(cut, b - 1)
    if cut < 1:
        return  # one anchor: nothing to split
    vals, _, nu, init = _run(method, [(s1, idx), (s2, idx)], n)
    h_vals, _, h_nu, h_init = _run(
        method, [(s1[:cut], idx[:cut]), (s1[cut:], idx[cut:]),
                 (s2[:cut], idx[:cut]), (s2[cut:], idx[cut:])], n)
    scale = 1 + max(np.abs(s1).max(), np.abs(s2).max()) / 0.7
    for whole, (a, c) in zip(vals, (h_vals[:2], h_vals[2:])):
        # the loss is a mean over anchors: the batch value is the size-weighted mean
        assert whole == pytest.approx((cut * a + (b - cut) * c) / b, rel=1e-10,
                                      abs=1e-10 * scale)
    np.testing.assert_allclose(h_nu.numpy(), nu.numpy(), rtol=0, atol=1e-12 * scale)
    assert torch.equal(h_init, init)


@given(loss_case(), st.sampled_from(METHODS), st.integers(1, 3), st.data())
@prop
def test_masked_padding_is_the_same_as_the_unpadded_batch(case, method, pad, data):
    """Padding every row with masked items of any value changes nothing; a float32 copy of
    the scores agrees to float32 precision (the dual table stays float64)."""
    s1, s2, idx, n = case
    b, k = s1.shape
    vals, grads, nu, _ = _run(method, [(s1, idx), (s2, idx)], n)
    junk = data.draw(hnp.arrays(np.float64, (b, pad), elements=st.floats(-1e4, 1e4, **finite)))
    where = data.draw(st.permutations(range(k + pad)))  # the padding anywhere in a row
    where = np.asarray(where)
    real = where < k  # columns holding the real items; item where[j] sits in column j
    mask = torch.as_tensor(np.broadcast_to(real, (b, k + pad)).copy())
    fn = _loss(method, n)
    p_vals, p_grads = [], []
    for s in (s1, s2):
        st_ = t(np.concatenate([s, junk], axis=1)[:, where]).requires_grad_(True)
        value = fn(st_, torch.as_tensor(idx), mask=mask)
        value.backward()
        p_vals.append(float(value.detach()))
        g = st_.grad.numpy()
        assert not g[:, ~real].any()  # padded items get no gradient
        p_grads.append(g[:, real])
    scale = 1 + max(np.abs(s1).max(), np.abs(s2).max()) / 0.7
    np.testing.assert_allclose(p_vals, vals, rtol=1e-10, atol=1e-10 * scale)
    for g, pg in zip(grads, p_grads):
        np.testing.assert_allclose(pg, g[:, where[real]], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fn.nu.numpy(), nu.numpy(), rtol=0, atol=1e-12 * scale)
    # float32 scores: the same updates up to float32 rounding of s / tau (relative 6e-8,
    # absolute 6e-8 * scale in L); exp(L - nu) turns that into a relative error of about
    # scale * 6e-8, which the ASGD step can carry into a huge nu (e.g. 0.2 e^{43})
    # (only where the float64 value fits in float32: a dual lagging far below the scores,
    # e.g. s = -90 then 0 with gamma ~ 1e-56, weighs items by e^{128}, inf in float32)
    fn32 = _loss(method, n)
    for s, v in zip((s1, s2), vals):
        v32 = float(fn32(torch.as_tensor(s, dtype=torch.float32), torch.as_tensor(idx)))
        if abs(v) < 1e30:
            assert v32 == pytest.approx(v, rel=1e-6 * scale, abs=1e-5 * scale)
    np.testing.assert_allclose(fn32.nu.numpy(), nu.numpy(), rtol=1e-6 * scale,
                               atol=1e-5 * scale)


# -- estimators --------------------------------------------------------------------------
@st.composite
def classification_data(draw, min_classes=2, max_classes=4):
    C = draw(st.integers(min_classes, max_classes))
    d = draw(st.integers(1, 4))
    per = draw(st.integers(1, 6))
    n = C * per + draw(st.integers(0, 4))
    y = np.concatenate([np.arange(C), draw(hnp.arrays(np.int64, n - C,
                                                      elements=st.integers(0, C - 1)))])
    integer = draw(st.booleans())
    elems = st.integers(-3, 3).map(float) if integer else st.floats(-2, 2, **finite)
    X = draw(hnp.arrays(np.float64, (n, d), elements=elems))
    X = X + draw(st.sampled_from([0.0, 1.0])) * y[:, None]  # some signal, sometimes
    return X, y


def _xc_models(C):
    return [SCENTClassifier(n_negatives=C - 1, epochs=2, batch_size=4, lr=0.5,
                            random_state=0),
            SCENTClassifier(loss="negatives", negatives="in_batch", method="sox", epochs=2,
                            batch_size=5, lr=0.1, fit_intercept=True, temperature=0.5,
                            random_state=1),
            SCENTClassifier(n_negatives=1, epochs=2, batch_size=3, lr=0.3, alpha=0.1,
                            momentum=0.5, fit_intercept=True, random_state=2)]


@given(classification_data(), st.integers(0, 2))
@prop
def test_scent_classifier_outputs_agree_with_each_other_and_the_objective(data, which):
    X, y = data
    C = len(np.unique(y))
    clf = _xc_models(C)[which].fit(X, y)
    W, b, tau = clf.coef_.astype(np.float64), clf.intercept_.astype(np.float64), clf.temperature
    z = X @ W.T + b
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba, softmax(z / tau, axis=1), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(clf.predict_log_proba(X), np.log(np.maximum(proba, 1e-300)),
                               rtol=1e-9, atol=1e-9)
    # predict is the argmax of the logits (ties: the first maximal class, as argmax)
    assert np.array_equal(clf.predict(X), clf.classes_[np.argmax(z, axis=1)])
    dec = clf.decision_function(X)
    np.testing.assert_allclose(dec, z[:, 1] - z[:, 0] if C == 2 else z, rtol=1e-9,
                               atol=1e-9 * (1 + np.abs(z).max()))
    assert clf.score(X, y) == np.mean(clf.predict(X) == y)
    # objective: the documented formula from the fitted parameters
    s = (z - z[np.arange(len(y)), y][:, None]) / tau
    if clf.loss == "softmax":
        ref = tau * np.mean(logsumexp(s, axis=1))
    else:
        s[np.arange(len(y)), y] = -np.inf
        ref = tau * np.mean(logsumexp(s, axis=1) - math.log(C - 1))
    ref += 0.5 * clf.alpha * np.sum(W ** 2)
    assert clf.objective(X, y) == pytest.approx(ref, rel=1e-9, abs=1e-9)
    assert clf.nu_.shape == (len(y),)


@given(classification_data(), st.integers(0, 2), st.sampled_from(["str", "affine", "neg"]))
@prop
def test_scent_classifier_fit_depends_on_label_order_not_label_values(data, which, kind):
    X, y = data
    C = len(np.unique(y))
    ref = _xc_models(C)[which].fit(X, y)
    # a monotone relabelling keeps the sorted class order, hence the class indices
    if kind == "str":
        y2 = np.array([f"c{v:03d}" for v in y])
    elif kind == "affine":
        y2 = 7 * y - 3
    else:  # a decreasing map reverses classes_: the weight rows come reversed
        y2 = -y
    got = _xc_models(C)[which].fit(X, y2)
    if kind != "neg":
        np.testing.assert_array_equal(got.coef_, ref.coef_)
        np.testing.assert_array_equal(got.nu_, ref.nu_)
        mapped = got.classes_[np.searchsorted(ref.classes_, ref.predict(X))]
        assert np.array_equal(got.predict(X), mapped)
    else:
        np.testing.assert_array_equal(got.classes_, ref.classes_[::-1] * -1)
        assert got.coef_.shape == ref.coef_.shape
    if kind == "neg" and which != 2:
        # (model 2 samples one negative by class index, which the reversal changes)
        # every class (exhaustive) or the batch's label set (in-batch) is used: the
        # same sets of negatives in another order, so the fit is the same up to float32
        # summation order; the weight rows come reversed
        np.testing.assert_allclose(got.coef_[::-1], ref.coef_, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got.intercept_[::-1], ref.intercept_, rtol=1e-4,
                                   atol=1e-5)


# an invariance on arbitrary data, some of which (raw, uncentred) SGD cannot fit in
# a few steps: the ConvergenceWarning saying so is expected there
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@given(classification_data(), st.integers(0, 2))
@prop
def test_scent_classifier_ignores_memory_layout_and_dtype_of_x(data, which):
    X, y = data
    C = len(np.unique(y))
    ref = _xc_models(C)[which].fit(X, y)
    ro = X.copy()
    ro.flags.writeable = False
    wide = np.zeros((X.shape[0], 2 * X.shape[1]))
    wide[:, ::2] = X
    for variant in (np.asfortranarray(X), ro, wide[:, ::2], torch.as_tensor(X),
                    X.tolist()):
        got = _xc_models(C)[which].fit(variant, y)
        np.testing.assert_array_equal(got.coef_, ref.coef_)
        np.testing.assert_array_equal(got.predict_proba(variant), ref.predict_proba(X))


@given(classification_data(), st.integers(0, 2), st.randoms(use_true_random=False))
@prop
def test_scent_classifier_is_equivariant_to_feature_order_and_sparse_storage(data, which, rnd):
    X, y = data
    C = len(np.unique(y))
    ref = _xc_models(C)[which].fit(X, y)
    perm = list(range(X.shape[1]))
    rnd.shuffle(perm)
    # the linear model's steps are equivariant to permuting features: the weight columns
    # permute (float32 dot products in another order: a few ulps after a few steps)
    got = _xc_models(C)[which].fit(X[:, perm], y)
    np.testing.assert_allclose(got.coef_, ref.coef_[:, perm], rtol=1e-5, atol=1e-6)
    # a CSR copy of X is the same data (sparse batches, same draws)
    sparse = _xc_models(C)[which].fit(sp.csr_matrix(X), y)
    np.testing.assert_allclose(sparse.coef_, ref.coef_, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sparse.predict_proba(sp.csr_matrix(X)), ref.predict_proba(X),
                               rtol=1e-5, atol=1e-6)


@st.composite
def regression_data(draw):
    n = draw(st.integers(3, 25))
    d = draw(st.integers(1, 3))
    X = draw(hnp.arrays(np.float64, (n, d), elements=st.floats(-2, 2, **finite)))
    y = draw(hnp.arrays(np.float64, n, elements=st.floats(-3, 3, **finite)))
    return X, y


@given(regression_data(), st.sampled_from(["scent", "sox", "bsgd"]),
       st.floats(0.05, 5, **finite), st.floats(1.01, 10, **finite))
@prop
def test_kldro_objective_between_mean_and_max_loss_and_decreasing_in_lam(data, method, lam,
                                                                        up):
    X, y = data
    reg = KLDRORegressor(lam=1.0, method=method, epochs=2, batch_size=4, lr=1e-3,
                         random_state=0).fit(X, y)
    ell = (X @ reg.coef_ + reg.intercept_ - y) ** 2
    np.testing.assert_allclose(reg.predict(X), X @ reg.coef_ + reg.intercept_, rtol=1e-12,
                               atol=1e-12)
    tol = 1e-9 * (1 + ell.max())
    lo = reg.set_params(lam=lam).objective(X, y)
    hi_lam = reg.set_params(lam=lam * up).objective(X, y)
    # Jensen: mean <= lam log mean exp(l / lam) <= max, and it decreases as lam grows
    assert ell.mean() - tol <= lo <= ell.max() + tol
    assert hi_lam <= lo + tol
    assert lo == pytest.approx(lam * (logsumexp(ell / lam) - math.log(len(y))), abs=tol)


@given(classification_data(max_classes=3))
@prop
def test_kldro_classifier_outputs_are_consistent(data):
    X, y = data
    clf = KLDROClassifier(epochs=2, batch_size=4, lr=1e-3, alpha=1e-1,
                          random_state=0).fit(X, y)
    z = X @ clf.coef_.T + clf.intercept_
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba, softmax(z, axis=1), rtol=1e-9, atol=1e-12)
    assert np.array_equal(clf.predict(X), clf.classes_[np.argmax(z, axis=1)])
    ell = logsumexp(z, axis=1) - z[np.arange(len(y)), np.searchsorted(clf.classes_, y)]
    pen = 0.5 * clf.alpha * np.sum(clf.coef_ ** 2)
    val = clf.objective(X, y) - pen
    assert ell.mean() - 1e-9 <= val <= ell.max() + 1e-9
    # relabelling by a monotone map gives the same model
    got = KLDROClassifier(epochs=2, batch_size=4, lr=1e-3, alpha=1e-1,
                          random_state=0).fit(X, np.array([f"k{v}" for v in y]))
    np.testing.assert_array_equal(got.coef_, clf.coef_)


@st.composite
def binary_data(draw):
    n_pos = draw(st.integers(1, 8))
    n_neg = draw(st.integers(1, 12))
    d = draw(st.integers(1, 3))
    # subnormal spreads are refused (test below): the coefficients overflow float64
    X = draw(hnp.arrays(np.float64, (n_pos + n_neg, d),
                        elements=st.floats(-2, 2, allow_subnormal=False, **finite)))
    y = np.r_[np.ones(n_pos, int), np.zeros(n_neg, int)]
    order = draw(st.permutations(range(n_pos + n_neg)))
    return X[order], y[order]


def test_partial_auc_refuses_features_whose_coefficients_overflow():
    # a spread of 1e-310 (subnormal): v / scale overflowed to an infinite coef_, NaN
    # decision scores and probabilities, silently (found by hypothesis)
    X = np.array([[0.0], [2.22507386e-311]])
    with pytest.raises(ValueError, match="spread is too small"):
        PartialAUCClassifier(epochs=2, random_state=0).fit(X, np.array([1, 0]))
    both = np.array([[0.0, 1.0], [2.22507386e-311, -1.0]])  # next to an ordinary feature
    with pytest.raises(ValueError, match="spread is too small"):
        PartialAUCClassifier(epochs=2, random_state=0).fit(both, np.array([1, 0]))
    X = np.random.default_rng(0).normal(size=(40, 2)) * 1e-300  # tiny units still fit
    clf = PartialAUCClassifier(epochs=2, random_state=0).fit(X, np.arange(40) % 2)
    assert np.isfinite(clf.decision_function(X)).all()


@given(binary_data(), st.floats(0.05, 1.0, **finite), st.floats(0.1, 3, **finite),
       st.floats(0.1, 2, **finite))
@prop
def test_partial_auc_outputs_consistent_and_objective_bounded(data, max_fpr, lam, margin):
    X, y = data
    clf = PartialAUCClassifier(lam=lam, margin=margin, max_fpr=max_fpr, epochs=2,
                               batch_size=3, n_negatives=4, random_state=0).fit(X, y)
    dec = clf.decision_function(X)
    np.testing.assert_allclose(dec, X @ clf.coef_ - clf.threshold_, rtol=1e-12,
                               atol=1e-12 * (1 + np.abs(X @ clf.coef_).max()))
    assert np.array_equal(clf.predict(X), clf.classes_[(dec > 0).astype(int)])
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(np.diff(proba[np.argsort(dec, kind="stable"), 1]) >= 0)
    # the training FPR of predict never exceeds max_fpr (threshold_ documented contract)
    neg = y == 0
    assert np.mean(dec[neg] > 0) <= max_fpr + 1e-12
    # pair losses lie in [(m - 1)_+^2, (m + 1)^2]; so does their KL-DRO aggregate
    obj = clf.objective(X, y)
    assert max(margin - 1, 0) ** 2 - 1e-9 <= obj <= (margin + 1) ** 2 + 1e-9
    # objective is the documented formula over all pairs from coef_ and intercept_
    h = 1 / (1 + np.exp(-(X @ clf.coef_ + clf.intercept_)))
    pair = np.maximum(margin - (h[y == 1][:, None] - h[neg][None, :]), 0) ** 2
    ref = lam * np.mean(logsumexp(pair / lam, axis=1) - math.log(neg.sum()))
    assert obj == pytest.approx(ref, rel=1e-9, abs=1e-12)
    # relabelled classes (a monotone map) fit the same scorer
    got = PartialAUCClassifier(lam=lam, margin=margin, max_fpr=max_fpr, epochs=2,
                               batch_size=3, n_negatives=4, random_state=0).fit(
        X, np.where(y == 1, "pos", "neg"))
    np.testing.assert_array_equal(got.coef_, clf.coef_)
