"""Regression tests from the adversarial audit of the SCENT estimators and kernels."""

import warnings

import numpy as np
import pytest
import torch

from mlpapers.optim.scent import (
    EntropicRiskLoss,
    KLDROClassifier,
    KLDRORegressor,
    PartialAUCClassifier,
    spmd_update,
)


def _regression_data(seed=1, n=120, d=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, X @ rng.normal(size=d) + rng.standard_t(3, n)


def test_kldro_regressor_is_invariant_to_feature_units():
    # raw features of magnitude ~100 made the plain SGD diverge silently (R^2 ~ -1e10)
    X, y = _regression_data()
    units = np.array([1.0, 100.0, 1e-3, 1e4])
    a = KLDRORegressor(epochs=20, lr=1e-3, random_state=0).fit(X, y)
    b = KLDRORegressor(epochs=20, lr=1e-3, random_state=0).fit(X * units + 500.0, y)
    assert b.objective(X * units + 500.0, y) == pytest.approx(a.objective(X, y), rel=1e-6)
    np.testing.assert_allclose(b.coef_ * units, a.coef_, rtol=1e-5, atol=1e-8)
    assert b.objective(X * units + 500.0, y) < b.init_objective_
    big = KLDRORegressor(random_state=0).fit(X * 100, y)  # the defaults diverged here
    ref = KLDRORegressor(random_state=0).fit(X, y)
    assert big.score(X * 100, y) == pytest.approx(ref.score(X, y), rel=1e-4)
    assert big.loss_curve_[-1] <= big.init_objective_ + 1e-9


def test_kldro_penalty_stays_in_original_units():
    X, y = _regression_data(seed=2)
    reg = KLDRORegressor(epochs=10, lr=1e-3, fit_intercept=False, alpha=0.1,
                         random_state=0).fit(X * 10.0, y)
    # the exact objective (penalty on the returned coef_) decreases from the ERM start
    assert reg.loss_curve_[-1] == pytest.approx(reg.objective(X * 10.0, y), rel=1e-9)
    assert reg.objective(X * 10.0, y) < reg.init_objective_
    assert reg.intercept_ == 0.0


def test_kldro_classifier_scaled_features_same_objective():
    X, _ = _regression_data(seed=3)
    y = np.where(X[:, 0] - X[:, 1] + 0.5 * np.random.default_rng(0).normal(size=len(X)) > 0,
                 "b", "a")
    a = KLDROClassifier(epochs=5, lr=1e-2, random_state=0).fit(X, y)
    b = KLDROClassifier(epochs=5, lr=1e-2, random_state=0).fit(X * 1e3, y)
    # (only the L-BFGS warm start depends on the units, to its tolerance)
    assert b.objective(X * 1e3, y) == pytest.approx(a.objective(X, y), rel=1e-2)
    assert b.objective(X * 1e3, y) < b.init_objective_
    np.testing.assert_array_equal(a.predict(X), b.predict(X * 1e3))


def test_partial_auc_score_rejects_unknown_labels_and_proba_never_overflows():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, 3))
    y = np.where(X[:, 0] > 0, 7, 3)
    clf = PartialAUCClassifier(epochs=3, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="not seen in fit"):
        clf.score(X, np.where(y == 3, 12345, y))  # silently nan / wrong before
    with pytest.raises(ValueError, match="shape"):
        clf.score(X, y[:-1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # np.exp overflowed for large scores
        proba = clf.predict_proba(X * 1e6)
    assert np.isfinite(proba).all()
    np.testing.assert_allclose(proba.sum(1), 1.0)


def test_spmd_update_limits_and_array_inputs():
    nu, L = torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.5])
    # alpha -> inf jumps to L, alpha -> 0 keeps nu (NaN before)
    torch.testing.assert_close(spmd_update(nu, L, float("inf")), L)
    torch.testing.assert_close(spmd_update(nu, L, float("-inf")), nu)
    ref = spmd_update(nu, L, 0.3)
    torch.testing.assert_close(spmd_update(nu.numpy(), L.numpy().tolist(), 0.3), ref)
    torch.testing.assert_close(spmd_update(torch.tensor([1, -2]), torch.tensor([2, 0]), 0.0),
                               spmd_update(torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.0]),
                                           0.0))
    with pytest.raises(ValueError, match="broadcastable"):
        spmd_update(torch.zeros(3), torch.zeros(2), 0.0)


def test_entropic_risk_loss_names_bad_log_alpha():
    with pytest.raises(ValueError, match="log_alpha"):
        EntropicRiskLoss(4, log_alpha="auto")


def test_partial_fit_sample_index_must_be_distinct_integers():
    from mlpapers.optim.scent import SCENTClassifier

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.integers(0, 3, 40)

    def fresh():
        return SCENTClassifier(n_negatives=1, batch_size=8, random_state=0)

    with pytest.raises(ValueError, match="sample_index"):  # 0.5 was truncated to 0
        fresh().partial_fit(X, y, classes=[0, 1, 2], sample_index=np.arange(40) + 0.5)
    with pytest.raises(ValueError, match="sample_index must not repeat"):
        # failed only when a batch drew both copies, with an error naming ``index``
        fresh().partial_fit(X, y, classes=[0, 1, 2],
                            sample_index=np.r_[np.arange(20), np.arange(20)])
    a = fresh().partial_fit(X, y, classes=[0, 1, 2], sample_index=np.arange(40.0))
    b = fresh().partial_fit(X, y, classes=[0, 1, 2], sample_index=torch.arange(40))
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_partial_auc_is_invariant_to_feature_units():
    # a noise feature in large units drove the pAUC below chance (0.48 vs 0.97) before
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = (X[:, 0] + 0.3 * rng.normal(size=300) > 0.5).astype(int)
    units = np.array([1.0, 1e4, 1e-2])
    a = PartialAUCClassifier(epochs=10, random_state=0).fit(X, y)
    b = PartialAUCClassifier(epochs=10, random_state=0).fit(X * units, y)
    assert b.score(X * units, y) == pytest.approx(a.score(X, y), abs=1e-9)
    np.testing.assert_allclose(b.coef_ * units, a.coef_, rtol=1e-4, atol=1e-7)
    assert b.objective(X * units, y) == pytest.approx(a.objective(X, y), rel=1e-5)


def test_partial_auc_feature_with_an_offset_still_learns():
    # scaling by the uncentred RMS made a 2000 +- 1 feature learn ~1e6 times slower
    # (pAUC 0.54 against 0.93); the std is the scale of what the scores vary with
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3))
    y = (X[:, 0] + 0.5 * rng.normal(size=400) > 0).astype(int)
    base = PartialAUCClassifier(random_state=0).fit(X, y).score(X, y)
    shifted = X + np.array([2000.0, 0.0, 0.0])
    clf = PartialAUCClassifier(random_state=0).fit(shifted, y)
    assert base > 0.85
    # the offset saturates the intercept-free sigmoid a little (0.85 vs 0.88), but
    # the weight still learns (RMS scaling: 0.54)
    assert clf.score(shifted, y) > base - 0.06
    assert clf.score(shifted, y[:, None]) == clf.score(shifted, y)  # column vector y


def test_entropic_risk_loss_accepts_numpy_scalars_for_log_alpha():
    from mlpapers.optim.scent import EntropicRiskLoss

    assert EntropicRiskLoss(3, log_alpha=np.array(1.5)).log_alpha == 1.5
    assert EntropicRiskLoss(3, log_alpha=np.float32(-2.0)).log_alpha == -2.0


@pytest.mark.parametrize("cls", ["regressor", "classifier"])
def test_kldro_penalty_stays_stable_on_features_of_tiny_spread(cls):
    # in standardised coordinates the L2 penalty has curvature alpha / s^2: a feature
    # of std 1e-3 made SGD diverge silently (objective ~1e29) with alpha = 0.1
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    y = (y - y.mean()) / y.std() if cls == "regressor" else (y > np.median(y)).astype(int)
    Est = KLDRORegressor if cls == "regressor" else KLDROClassifier
    small = X * np.r_[1.0, 1.0, 1e-3, np.ones(X.shape[1] - 3)]
    est = Est(epochs=5, alpha=0.1, random_state=0).fit(small, y)
    assert np.isfinite(est.loss_curve_).all()
    assert est.loss_curve_[-1] <= est.init_objective_ + 1e-3
    assert np.abs(est.coef_).max() < 1e3
