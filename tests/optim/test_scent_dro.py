"""KL-DRO estimators: exact objective, improvement over ERM, closeness to the optimum."""

import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import logsumexp
from sklearn.datasets import load_diabetes
from sklearn.preprocessing import StandardScaler

from mlpapers.optim import KLDROClassifier, KLDRORegressor


@pytest.fixture(scope="module")
def diabetes():
    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X), (y - y.mean()) / y.std()


def exact_dro_optimum(X, y, lam):
    A = np.c_[X, np.ones(len(X))]

    def f(theta):
        r = A @ theta - y
        ell = r**2 / lam
        p = np.exp(ell - logsumexp(ell))
        return lam * (logsumexp(ell) - math.log(len(y))), A.T @ (p * 2 * r)

    theta0 = np.linalg.lstsq(A, y, rcond=None)[0]
    res = minimize(f, theta0, jac=True, method="L-BFGS-B", options=dict(maxiter=2000))
    return res.fun


def test_objective_is_exact_and_erm_warm_start(diabetes):
    X, y = diabetes
    reg = KLDRORegressor(lam=1.0, epochs=1, random_state=0).fit(X, y)
    r = reg.predict(X) - y
    assert reg.objective(X, y) == pytest.approx(logsumexp(r**2) - math.log(len(y)), rel=1e-9)
    ols = np.linalg.lstsq(np.c_[X, np.ones(len(X))], y, rcond=None)[0]
    r0 = np.c_[X, np.ones(len(X))] @ ols - y
    assert reg.init_objective_ == pytest.approx(logsumexp(r0**2) - math.log(len(y)), rel=1e-9)


# lam = 0.2 used log_alpha="auto" with a 5 % gap: 3 of 12 other seeds missed it (two ended
# above the ERM start, see the user guide); the default None closed >= 82 % of the gap on
# 13 of 13 seeds (its nu_ lags nu* by up to 3.9 there: batch log-mean-exps of heavy-tailed
# losses are biased low and gamma >= 1/2 averages few batches). "auto" at lam = 1 kept
# gap < 2 % and |nu_ - nu*| < 0.11 on 13 of 13 seeds.
@pytest.mark.parametrize("lam, log_alpha, max_gap, nu_tol",
                         [(0.2, None, 0.25, None), (1.0, "auto", 0.05, 0.5)])
def test_scent_approaches_the_exact_dro_optimum(diabetes, lam, log_alpha, max_gap, nu_tol):
    X, y = diabetes
    f_star = exact_dro_optimum(X, y, lam)
    reg = KLDRORegressor(lam=lam, epochs=40, lr=1e-3, log_alpha=log_alpha,
                         random_state=0).fit(X, y)
    assert reg.objective(X, y) - f_star < max_gap * (reg.init_objective_ - f_star)
    assert reg.objective(X, y) >= f_star - 1e-6
    if nu_tol is not None:  # the dual variable tracks log mean exp(loss / lam)
        r = reg.predict(X) - y
        assert reg.nu_ == pytest.approx(logsumexp(r**2 / lam) - math.log(len(y)), abs=nu_tol)


def test_small_lambda_scent_stable_where_asgd_diverges(diabetes):
    # Seeds 0-12: the default log_alpha=None improved on the ERM start on all 13; ASGD
    # diverged on 12. log_alpha="auto" (once also asserted here) ended above the ERM start
    # on 6 of 12 seeds (objective up to +436): its gamma = sigmoid(nu - nu_0) collapses as
    # the loss falls, the failure the user guide describes, so it is not claimed stable.
    X, y = diabetes
    diverged = 0
    for seed in range(3):
        reg = KLDRORegressor(lam=0.2, epochs=10, lr=1e-3, random_state=seed).fit(X, y)
        assert np.isfinite(reg.loss_curve_).all()
        assert reg.loss_curve_[-1] < reg.init_objective_
        try:
            KLDRORegressor(lam=0.2, method="asgd", epochs=10, lr=1e-3,
                           random_state=seed).fit(X, y)
        except FloatingPointError as exc:
            assert "diverged" in str(exc)
            diverged += 1
    assert diverged >= 2


def test_large_lambda_recovers_least_squares(diabetes):
    X, y = diabetes
    reg = KLDRORegressor(lam=1e4, epochs=3, random_state=0).fit(X, y)
    ols = np.linalg.lstsq(np.c_[X, np.ones(len(X))], y, rcond=None)[0]
    np.testing.assert_allclose(reg.coef_, ols[:-1], atol=2e-2)


def test_classifier_reduces_worst_case_loss():
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    clf = KLDROClassifier(lam=0.5, epochs=15, lr=1e-2, random_state=0).fit(X, y)
    assert clf.objective(X, y) < clf.init_objective_
    assert clf.score(X, y) > 0.9
    p = clf.predict_proba(X)
    np.testing.assert_allclose(p.sum(1), 1.0)
    assert clf.decision_function(X).shape == (len(X),)
    with pytest.raises(ValueError, match="not seen in fit"):
        clf.objective(X[:2], np.array([0, 7]))


def test_determinism_errors_and_save_load(tmp_path, diabetes):
    X, y = diabetes
    a = KLDRORegressor(epochs=2, random_state=1).fit(X, y)
    b = KLDRORegressor(epochs=2, random_state=1).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    with pytest.raises(ValueError, match="lam"):
        KLDRORegressor(lam=0.0).fit(X, y)
    with pytest.raises(ValueError, match="log_alpha"):
        KLDRORegressor(log_alpha="big").fit(X, y)
    with pytest.raises(ValueError, match="init"):
        KLDRORegressor(init="ols").fit(X, y)
    yn = y.copy()
    yn[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        KLDRORegressor().fit(X, yn)
    a.save(tmp_path / "dro.pt")
    back = KLDRORegressor.load(tmp_path / "dro.pt")
    np.testing.assert_array_equal(back.predict(X), a.predict(X))


@pytest.mark.parametrize("offset", [1e7, 1e9])
def test_regressor_fit_does_not_depend_on_a_target_offset(offset):
    # y and the intercept were rounded to float32 at the size of the offset (steps of 1
    # at 1e7, 64 at 1e9): the fit ended above its start, with a warning blaming lr
    import warnings

    from mlpapers.optim.scent import KLDRORegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = X @ [1.0, 2.0, 3.0] + rng.normal(size=200)
    kw = dict(lam=1.0, epochs=40, lr=1e-3, random_state=0)
    ref = KLDRORegressor(**kw).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        est = KLDRORegressor(**kw).fit(X, y + offset)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-5)
    assert est.intercept_ - offset == pytest.approx(ref.intercept_, abs=1e-6)
    assert est.objective(X, y + offset) == pytest.approx(ref.objective(X, y), rel=1e-6)


def test_pauc_objective_checks_lam_and_margin_set_after_fit():
    from mlpapers.optim.scent import PartialAUCClassifier

    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 3))
    y = (X[:, 0] > 0).astype(int)
    clf = PartialAUCClassifier(epochs=2, random_state=0).fit(X, y)
    for name, bad in [("lam", 0), ("lam", -1), ("lam", np.inf), ("margin", -1)]:
        with pytest.raises(ValueError, match=name):
            clf.set_params(**{name: bad}).objective(X, y)
        clf.set_params(lam=0.1, margin=1.0)
    assert np.isfinite(clf.objective(X, y))
