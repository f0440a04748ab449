"""PartialAUCClassifier: exact pairwise objective, pAUC score, threshold, errors."""

import math

import numpy as np
import pytest
from scipy.special import logsumexp
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.preprocessing import StandardScaler

from mlpapers.optim import PartialAUCClassifier


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return StandardScaler().fit_transform(X), 1 - y  # malignant = positive


def brute_objective(w, X, y, lam, margin, b=0.0):
    h = 1 / (1 + np.exp(-(X @ w + b)))
    hp, hn = h[y == 1], h[y == 0]
    total = 0.0
    for a in hp:  # explicit loop over anchors: the reference, not the implementation
        ell = np.maximum(margin - (a - hn), 0) ** 2 / lam
        total += logsumexp(ell) - math.log(len(hn))
    return lam * total / len(hp)


def test_objective_score_and_threshold(cancer):
    X, y = cancer
    clf = PartialAUCClassifier(lam=0.5, margin=0.8, epochs=8, random_state=0).fit(X, y)
    assert clf.objective(X, y) == pytest.approx(
        brute_objective(clf.coef_, X, y, 0.5, 0.8, clf.intercept_), rel=1e-10)
    assert clf.intercept_ == pytest.approx(-X.mean(0) @ clf.coef_, abs=1e-6)  # float32 X
    assert clf.score(X, y) == pytest.approx(
        roc_auc_score(y, clf.decision_function(X), max_fpr=0.3))
    fpr = np.mean(clf.predict(X[y == 0]) == 1)
    assert fpr <= 0.3 + 1e-9
    # dual variables of positives track log mean_j exp(L_ij / lam)
    h = 1 / (1 + np.exp(-(X @ clf.coef_ + clf.intercept_)))
    ell = np.maximum(0.8 - (h[y == 1][:, None] - h[y == 0][None]), 0) ** 2 / 0.5
    nu_star = logsumexp(ell, axis=1) - math.log((y == 0).sum())
    assert np.mean(np.abs(clf.nu_ - nu_star)) < 0.1


def test_training_lowers_objective_and_small_lambda_stable(cancer):
    X, y = cancer
    clf = PartialAUCClassifier(lam=0.1, epochs=10, random_state=0).fit(X, y)
    init = brute_objective(np.zeros(X.shape[1]), X, y, 0.1, 1.0)
    assert init == pytest.approx(1.0)  # all sigmoid scores equal: L = margin^2
    # 0.074 here; 0.08-0.18 on seeds 1-12 (the bound was 0.1: 2 of 12 missed it)
    assert clf.loss_curve_[-1] < 0.25 * init
    assert np.isfinite(clf.nu_).all()
    assert clf.score(X, y) > 0.9


def test_errors_and_persistence(tmp_path, cancer):
    X, y = cancer
    with pytest.raises(ValueError, match="Only binary"):
        PartialAUCClassifier().fit(X[:30], np.arange(30) % 3)
    with pytest.raises(ValueError, match="max_fpr"):
        PartialAUCClassifier(max_fpr=1.5).fit(X, y)
    clf = PartialAUCClassifier(epochs=2, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="not seen in fit"):
        clf.objective(X[:3], np.array([0, 1, 5]))
    clf.save(tmp_path / "pauc.pt")
    back = PartialAUCClassifier.load(tmp_path / "pauc.pt")
    np.testing.assert_array_equal(back.decision_function(X), clf.decision_function(X))
    again = PartialAUCClassifier(epochs=2, random_state=0).fit(X, y)
    np.testing.assert_array_equal(again.coef_, clf.coef_)
    fpr, tpr, _ = roc_curve(y, clf.decision_function(X))
    assert tpr[-1] == 1.0 and fpr[0] == 0.0


@pytest.mark.parametrize("n_neg, max_fpr", [(5, 0.3), (15, 0.3), (2, 0.3), (10, 1e-3), (50, 0.5)])
def test_training_fpr_never_exceeds_max_fpr(n_neg, max_fpr):
    # regression: the linearly interpolated quantile let ceil((n_neg - 1) max_fpr)
    # negatives above the threshold (2 of 5 at max_fpr=0.3), and the threshold was
    # scored on float32 features while predict scores float64 ones
    rng = np.random.default_rng(n_neg)
    X = np.r_[rng.normal(size=(n_neg, 2)), rng.normal(size=(10, 2)) + 1.0]
    y = np.r_[np.zeros(n_neg, int), np.ones(10, int)]
    clf = PartialAUCClassifier(max_fpr=max_fpr, epochs=2, random_state=0).fit(X, y)
    assert (clf.predict(X[:n_neg]) == 1).mean() <= max_fpr
    assert (clf.predict(X) == 1)[:n_neg].sum() == int(np.floor(max_fpr * (n_neg - 1)))
