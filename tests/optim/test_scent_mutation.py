"""SCENT: tests that kill mutants the rest of the suite let through.

Each test asserts a property of the paper's equations (closed forms written in
float64 numpy here) or a documented behaviour that an earlier suite left unchecked.
"""

import math

import numpy as np
import pytest
import torch
from scipy.special import expit, logsumexp

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    objective,
    softplus_dual_ratio,
    spmd_gamma,
    spmd_update,
    umax_update,
)


def t(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


# -- kernels -------------------------------------------------------------------------
def test_spmd_gamma_is_the_prox_weight_of_the_update():
    # gamma = alpha e^nu / (1 + alpha e^nu) and e^{nu_t} = (1 - gamma) e^nu + gamma e^L
    rng = np.random.default_rng(0)
    nu, L, la = rng.normal(size=6), rng.normal(size=6), rng.normal(size=6)
    ae = np.exp(la + nu)
    gamma = ae / (1 + ae)
    got = spmd_gamma(t(nu), t(la)).numpy()
    np.testing.assert_allclose(got, gamma, rtol=1e-12)
    new = spmd_update(t(nu), t(L), t(la)).numpy()
    np.testing.assert_allclose(np.exp(new), (1 - got) * np.exp(nu) + got * np.exp(L), rtol=1e-12)


def test_scent_loss_reports_the_gamma_of_the_previous_nu():
    # last_stats' gamma is the weight of the step just taken: sigma(log alpha + nu_{t-1})
    loss = EntropicRiskLoss(3, log_alpha=-1.0, nu_init=0.5)
    s = t([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]])
    loss(s, torch.arange(3))
    old = loss.nu.clone().numpy()
    loss(s + 1.0, torch.arange(3))
    g = expit(-1.0 + old)
    assert loss.last_stats["gamma_mean"] == pytest.approx(g.mean(), rel=1e-12)
    assert loss.last_stats["gamma_min"] == pytest.approx(g.min(), rel=1e-12)
    assert loss.last_stats["gamma_max"] == pytest.approx(g.max(), rel=1e-12)


def test_umax_resets_only_strictly_below_the_threshold():
    # the reset fires where nu < L - delta; at nu == L - delta it is a plain ASGD step
    L, delta, lr = t([2.0]), 1.0, 0.25
    at = umax_update(t([1.0]), L, lr, delta)
    assert float(at[0]) == pytest.approx(1.0 - lr * (1.0 - math.exp(1.0)), abs=1e-12)
    below = umax_update(t([0.5]), L, lr, delta)  # reset to L = 2, then a step at nu = L
    assert float(below[0]) == pytest.approx(2.0, abs=1e-12)


def test_masked_softplus_ratio_equals_the_ratio_over_the_valid_items():
    rng = np.random.default_rng(1)
    s, nu, rho = rng.normal(size=(3, 5)), rng.normal(size=3), 1e-2
    mask = np.ones((3, 5), dtype=bool)
    mask[0, 3:] = False
    mask[2, 1:] = False
    got = softplus_dual_ratio(t(s), t(nu), rho, mask=torch.as_tensor(mask)).numpy()
    for i in range(3):
        ref = np.mean(expit(s[i][mask[i]] - nu[i] + math.log(rho)) / rho)
        assert got[i] == pytest.approx(ref, rel=1e-12)


def test_objective_default_temperature_is_one():
    s = np.random.default_rng(2).normal(size=(4, 6))
    ref = np.mean(logsumexp(s, axis=1) - math.log(6))
    assert float(objective(t(s))) == pytest.approx(ref, abs=1e-12)


# -- the surrogate loss ------------------------------------------------------------------
@pytest.mark.parametrize("method", ["scent", "sox", "umax"])
@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_first_visit_value_is_the_exact_entropic_risk(method, tau):
    # at a first visit nu_i := L_i, so the dual value tau mean_i[mean_j e^{s/tau - nu} + nu - 1]
    # equals tau mean_i L_i, the exact risk of the batch
    s = np.random.default_rng(3).normal(size=(4, 5))
    value = EntropicRiskLoss(4, method=method, temperature=tau)(t(s), torch.arange(4)).detach()
    ref = tau * np.mean(logsumexp(s / tau, axis=1) - math.log(5))
    assert float(value) == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("shift", [0.0, 30.0])
def test_asgd_softplus_value_and_gradient_follow_the_safe_kl_surrogate(shift):
    # loss = mean_i [mean_j log(1 + rho e^{s_ij - nu_i}) / rho + nu_i - 1] with the OLD nu,
    # gradient sigma(s_ij - nu_i + log rho) / (rho B k). shift=30 puts s - nu + log rho
    # above 20, where F.softplus's default threshold returned x (gradient 1, not sigma):
    # 2e-9 relative off in float64
    rng = np.random.default_rng(4)
    s, nu0, rho = rng.normal(size=(2, 3)) + shift, 0.3, 1e-2
    loss = EntropicRiskLoss(2, method="asgd_softplus", rho=rho, nu_init=nu0)
    sw = t(s).requires_grad_()
    value = loss(sw, torch.arange(2))
    value.backward()
    ref = np.mean(np.mean(np.logaddexp(0.0, s - nu0 + math.log(rho)), axis=1) / rho + nu0 - 1)
    assert float(value.detach()) == pytest.approx(ref, rel=1e-14, abs=1e-12)
    grad = expit(s - nu0 + math.log(rho)) / rho / s.size
    np.testing.assert_allclose(sw.grad.numpy(), grad, rtol=1e-13)


# -- SCENTClassifier -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def xc_problem():
    from mlpapers.datasets import make_extreme_classification

    return make_extreme_classification(300, 12, 6, noise=1.0, random_state=0)


def test_cosine_schedule_decays_lr_from_its_full_value(xc_problem):
    # every negative + bsgd + full batch = full-softmax gradient descent; the cosine
    # schedule takes steps with lr * (1 + cos(pi t / T)) / 2 for t = 0 .. T-1
    from mlpapers.optim import SCENTClassifier

    X, y = xc_problem
    C, T, lr = len(np.unique(y)), 3, 0.5
    clf = SCENTClassifier(n_negatives=C - 1, method="bsgd", epochs=T, lr=lr,
                          batch_size=len(X), lr_schedule="cosine", random_state=0).fit(X, y)
    Xt = torch.tensor(X, dtype=torch.float64)
    yt = torch.tensor(np.searchsorted(clf.classes_, y))
    W = torch.zeros(C, X.shape[1], dtype=torch.float64, requires_grad=True)
    for step in range(T):
        W.grad = None
        torch.nn.functional.cross_entropy(Xt @ W.T, yt).backward()
        with torch.no_grad():
            W -= lr * 0.5 * (1 + math.cos(math.pi * step / T)) * W.grad
    np.testing.assert_allclose(clf.coef_, W.detach().numpy(), atol=1e-5)


def test_binary_decision_function_is_the_logit_difference(xc_problem):
    from mlpapers.optim import SCENTClassifier

    X, y = xc_problem
    keep = np.isin(y, np.unique(y)[:2])
    X2, y2 = X[keep], y[keep]
    clf = SCENTClassifier(n_negatives=1, epochs=3, fit_intercept=True, random_state=0)
    clf.fit(X2, y2)
    w, b = clf.coef_.astype(np.float64), clf.intercept_.astype(np.float64)
    ref = X2 @ (w[1] - w[0]) + (b[1] - b[0])
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(clf.decision_function(X2), ref, rtol=1e-6, atol=1e-6)


# -- KL-DRO warm start ---------------------------------------------------------------------
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_erm_logistic_warm_start_is_stationary(fit_intercept):
    # the ERM start minimises mean CE + alpha/2 |W|^2: its gradient vanishes there
    from mlpapers.optim.scent._dro_init import erm_logistic

    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 4)) * [1.0, 3.0, 0.5, 2.0] + 1.0
    y = rng.integers(0, 3, 120)
    X[:, 0] += y  # informative: the optimum is far from zero
    alpha = 1e-2
    W, b = erm_logistic(t(X), torch.as_tensor(y), 3, alpha=alpha, fit_intercept=fit_intercept)
    assert float(W.abs().max()) > 0.1
    W = W.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    f = (torch.nn.functional.cross_entropy(t(X) @ W.T + b, torch.as_tensor(y))
         + 0.5 * alpha * (W * W).sum())
    gW, gb = torch.autograd.grad(f, [W, b])
    assert float(gW.abs().max()) < 1e-6
    if fit_intercept:
        assert float(gb.abs().max()) < 1e-6
    else:
        assert float(b.detach().abs().max()) == 0.0


def test_sparse_prediction_in_row_blocks_covers_every_row(monkeypatch, xc_problem):
    # a CSR X is predicted block by block over its rows (more rows than features here)
    import scipy.sparse as sp

    import mlpapers.optim.scent._xc_predict as mod
    from mlpapers.optim import SCENTClassifier

    X, y = xc_problem
    clf = SCENTClassifier(n_negatives=4, epochs=2, fit_intercept=True, random_state=0).fit(X, y)
    C = len(clf.classes_)
    monkeypatch.setattr(mod, "_CHUNK_ELEMENTS", 7 * C)  # 7 rows per block
    z = X.astype(np.float64) @ clf.coef_.T.astype(np.float64) + clf.intercept_
    p = np.exp(z - logsumexp(z, axis=1, keepdims=True))
    got = clf.predict_proba(sp.csr_matrix(X))
    assert got.shape == (len(X), C)
    np.testing.assert_allclose(got, p, atol=1e-6)


# -- partial AUC -----------------------------------------------------------------------------
def test_partial_auc_draws_every_negative():
    # one positive, two negatives: the second sits on the positive (its pair has no
    # gradient), so the scorer moves only through the first negative
    from mlpapers.optim import PartialAUCClassifier

    X = np.array([[1.0], [0.0], [1.0]])
    y = np.array([1, 0, 0])
    clf = PartialAUCClassifier(n_negatives=1, batch_size=1, epochs=20, lr=0.5,
                               random_state=0).fit(X, y)
    assert clf.coef_[0] > 1e-3


def test_partial_auc_plain_sgd_with_zero_momentum():
    # momentum=0 is plain SGD (Nesterov needs a positive momentum)
    from sklearn.datasets import load_breast_cancer
    from sklearn.preprocessing import StandardScaler

    from mlpapers.optim import PartialAUCClassifier

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)[:200]
    clf = PartialAUCClassifier(momentum=0.0, epochs=3, random_state=0).fit(X, y[:200])
    # at w = 0 every pair loss is margin^2 = 1, so the objective starts at exactly 1
    assert clf.loss_curve_[-1] < 0.9
    assert clf.score(X, y[:200]) > 0.8


@pytest.mark.parametrize("method", ["scent", "sox", "asgd", "umax", "asgd_softplus"])
def test_first_visit_sets_nu_to_the_batch_log_mean_exp(method):
    # nu_init=None: nu_i := L_i at an anchor's first visit, for every dual rule
    s = np.random.default_rng(6).normal(size=(3, 4)) * 2
    loss = EntropicRiskLoss(5, method=method, temperature=0.5)
    loss(t(s), torch.tensor([4, 0, 2]))
    ref = logsumexp(s / 0.5, axis=1) - math.log(4)
    np.testing.assert_allclose(loss.nu[[4, 0, 2]].numpy(), ref, rtol=0, atol=1e-12)
    assert loss.initialized.tolist() == [True, False, True, False, True]


# -- KL-DRO dual schedules (primal frozen by a vanishing lr, so nu follows its own rule) ----
def _two_point_regression():
    # no intercept, ERM w = 0.2: residuals 0.8 and -0.4, losses 0.64 and 0.16
    X, y = np.array([[1.0], [2.0]]), np.array([1.0, 0.0])
    return X, y, np.array([0.64, 0.16])


def test_kldro_auto_log_alpha_is_minus_the_initial_dual_variable():
    # log_alpha="auto" = -nu_0, nu_0 = log mean exp(l / lam) at the ERM start; two
    # one-sample steps: nu := L_first, then the SPMD step with that alpha towards L_second
    from mlpapers.optim import KLDRORegressor

    X, y, ell = _two_point_regression()
    lam = 0.1
    reg = KLDRORegressor(lam=lam, log_alpha="auto", fit_intercept=False, lr=1e-30,
                         batch_size=1, epochs=1, random_state=0).fit(X, y)
    np.testing.assert_allclose(reg.coef_, [0.2], rtol=1e-6)
    s = ell / lam
    la = -(logsumexp(s) - math.log(2))
    ends = []
    for a, b in [(0, 1), (1, 0)]:
        g = expit(la + s[a])
        ends.append(np.log((1 - g) * np.exp(s[a]) + g * np.exp(s[b])))
    assert min(abs(reg.nu_ - e) for e in ends) < 1e-4
    assert abs(ends[0] - ends[1]) > 0.1


def test_kldro_dual_step_decays_with_the_cosine_schedule():
    # asgd_softplus, full batch: nu := L, then nu -= dual_lr f_t (1 - mean sigma(s - nu +
    # log rho) / rho) with f_t = (1 + cos(pi t / T)) / 2, as the primal step decays
    from mlpapers.optim import KLDRORegressor

    X, y, ell = _two_point_regression()
    lam, rho, dual_lr, T = 0.5, 0.5, 0.5, 4
    reg = KLDRORegressor(lam=lam, method="asgd_softplus", rho=rho, dual_lr=dual_lr,
                         fit_intercept=False, lr=1e-30, batch_size=2, epochs=T,
                         random_state=0).fit(X, y)
    s = ell / lam
    nu = logsumexp(s) - math.log(2)
    for step in range(1, T):
        ratio = np.mean(expit(s - nu + math.log(rho)) / rho)
        nu -= dual_lr * 0.5 * (1 + math.cos(math.pi * step / T)) * (1 - ratio)
    assert reg.nu_ == pytest.approx(nu, abs=1e-5)


def test_set_params_gamma_between_partial_fits_acts_like_a_reloaded_model():
    # SOX's gamma set between partial_fit calls is used by the live model too
    import pickle

    from mlpapers.datasets import make_extreme_classification
    from mlpapers.optim import SCENTClassifier

    X, y = make_extreme_classification(200, 8, 4, noise=0.5, min_samples_per_class=2,
                                       random_state=1)
    live = SCENTClassifier(n_negatives=3, batch_size=50, method="sox", gamma=0.9,
                           random_state=0)
    live.partial_fit(X, y, classes=np.unique(y))
    copy = pickle.loads(pickle.dumps(live))
    for est in (live, copy):
        est.set_params(gamma=0.05).partial_fit(X, y)
    np.testing.assert_array_equal(live.nu_, copy.nu_)
    np.testing.assert_array_equal(live.coef_, copy.coef_)


def test_partial_auc_pair_loss_is_the_squared_hinge_on_sigmoid_scores():
    # L(h_i - h_j) = (m - (h_i - h_j))_+^2 with h = sigmoid(w x): zero beyond the margin
    from mlpapers.optim import PartialAUCClassifier

    rng = np.random.default_rng(7)
    Xp, Xn, w = rng.normal(size=(4, 3)), rng.normal(size=(5, 3)), 3 * rng.normal(size=3)
    clf = PartialAUCClassifier(margin=0.2)
    got = clf._pair_losses(t(w), t(Xp), t(Xn)).numpy()
    d = expit(Xp @ w)[:, None] - expit(Xn @ w)[None, :]
    ref = np.maximum(0.2 - d, 0.0) ** 2
    assert (ref == 0).any() and (ref > 0).any()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0)
