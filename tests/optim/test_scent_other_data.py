"""SCENT estimators on data not made by ``mlpapers.datasets`` (audit: data made elsewhere).

scikit-learn's bundled real data sets (digits, breast cancer, iris, diabetes) and
``make_classification`` settings far from our Zipf-cluster generator (21 classes with
one class at 1:50, redundant features), with the layouts and label codings users pass.
Each test compares with an exact or named reference: scikit-learn's
``LogisticRegression``, the chance level, an L-BFGS optimum of the same convex
objective, or the same fit on transformed data. The measured values are in the
docstrings; the thresholds leave a clear margin.
"""

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import logsumexp
from sklearn.datasets import (
    load_breast_cancer,
    load_diabetes,
    load_digits,
    load_iris,
    make_classification,
)
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from mlpapers.optim import KLDROClassifier, KLDRORegressor, PartialAUCClassifier, SCENTClassifier


def _split_std(X, y, seed=0):
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=seed, stratify=y)
    sc = StandardScaler().fit(Xtr)
    return sc.transform(Xtr), sc.transform(Xte), ytr, yte


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return _split_std(X, y)


def test_classifier_defaults_on_digits_match_logistic_regression(digits):
    """Standardised digits (10 classes, 64 pixel features), defaults except
    ``n_negatives=9`` (all other classes): test accuracy 0.961 measured, scikit-learn's
    ``LogisticRegression`` 0.972, majority class 0.10."""
    A, B, ytr, yte = digits
    ref = LogisticRegression(max_iter=3000).fit(A, ytr).score(B, yte)
    acc = SCENTClassifier(n_negatives=9, random_state=0).fit(A, ytr).score(B, yte)
    assert acc > 0.93
    assert acc > ref - 0.04


def test_classifier_imbalanced_many_classes_matches_logistic_regression():
    """``make_classification``: 21 classes, the last at 1:50 of the others, 12
    informative of 20 features; ``n_negatives=8`` sampled negatives. Test accuracy
    0.859 measured against ``LogisticRegression`` 0.870 (majority 0.05)."""
    w = np.ones(21)
    w[-1] = 0.02
    w /= w.sum()
    X, y = make_classification(4000, 20, n_informative=12, n_classes=21,
                               n_clusters_per_class=1, weights=list(w[:-1]),
                               class_sep=2.0, random_state=1)
    A, B, ytr, yte = _split_std(X, y)
    ref = LogisticRegression(max_iter=3000).fit(A, ytr).score(B, yte)
    acc = SCENTClassifier(n_negatives=8, epochs=10, random_state=0).fit(A, ytr).score(B, yte)
    assert acc > ref - 0.05
    assert acc > 0.75


def test_classifier_label_coding_and_layout_do_not_change_the_fit(digits):
    """String, object and affinely recoded (``7y - 3``) labels sort like the
    integers, and float32 Fortran-ordered arrays are read as the float64 C array:
    the learned weights are identical, bit for bit, and predictions map to the
    user's codes."""
    A, _, ytr, _ = digits
    names = np.array(list("abcdefghij"))
    kw = dict(n_negatives=9, epochs=2, random_state=0)
    ref = SCENTClassifier(**kw).fit(A, ytr)
    for X, y in [(A, ytr * 7 - 3), (A, names[ytr]), (A, names[ytr].astype(object)),
                 (np.asfortranarray(A.astype(np.float32)), ytr)]:
        m = SCENTClassifier(**kw).fit(X, y)
        np.testing.assert_array_equal(m.coef_, ref.coef_)
        np.testing.assert_array_equal(m.predict(A[:50]), m.classes_[ref.predict(A[:50])])


def test_classifier_small_centred_data_needs_intercept_and_steps():
    """Iris (105 training rows, standardised): the documented recipe
    ``fit_intercept=True, batch_size=16`` reaches 0.978 test accuracy
    (``LogisticRegression`` 0.978; the defaults, without intercept and one step an
    epoch, stop at 0.82, see the user guide)."""
    X, y = load_iris(return_X_y=True)
    A, B, ytr, yte = _split_std(X, y)
    acc = SCENTClassifier(n_negatives=2, fit_intercept=True, batch_size=16,
                          random_state=0).fit(A, ytr).score(B, yte)
    assert acc > 0.93


@pytest.fixture(scope="module")
def cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return train_test_split(X, 1 - y, test_size=0.3, random_state=0, stratify=y)


def test_pauc_on_raw_breast_cancer_is_near_logistic_regression_and_unit_free(cancer):
    """Raw breast-cancer features (units from 1e-3 to 1e3), malignant positive:
    test pAUC(FPR<=0.3) 0.983 measured at the default 50 epochs (0.986 here at 10),
    ``LogisticRegression`` on standardised data 0.984, a random ranking 0.5. The fit
    on ``X * 1e-4 + 1e4`` gives the same ranking (the estimator centres and
    preconditions): measured equal to every digit."""
    Xtr, Xte, ytr, yte = cancer
    sc = StandardScaler().fit(Xtr)
    lr = LogisticRegression(max_iter=3000).fit(sc.transform(Xtr), ytr)
    ref = roc_auc_score(yte, lr.decision_function(sc.transform(Xte)), max_fpr=0.3)
    m = PartialAUCClassifier(epochs=10, random_state=0).fit(Xtr, ytr)
    s = m.score(Xte, yte)
    assert s > 0.95 and s > ref - 0.03
    m2 = PartialAUCClassifier(epochs=10, random_state=0).fit(Xtr * 1e-4 + 1e4, ytr)
    assert abs(m2.score(Xte * 1e-4 + 1e4, yte) - s) < 2e-3


def test_kldro_classifier_raw_and_offset_features_agree(cancer):
    """KLDROClassifier on raw breast-cancer features and on ``X + 1e4``: the steps run
    on internally standardised features, so the two fits classify the test set alike
    (measured: identical predictions, accuracy 0.947 at 5 epochs against
    ``LogisticRegression`` 0.959)."""
    Xtr, Xte, ytr, yte = cancer
    a = KLDROClassifier(epochs=5, random_state=0).fit(Xtr, ytr)
    b = KLDROClassifier(epochs=5, random_state=0).fit(Xtr + 1e4, ytr)
    agree = np.mean(a.predict(Xte) == b.predict(Xte + 1e4))
    assert agree > 0.97
    assert a.score(Xte, yte) > 0.9


def _dro_optimum(X, y, lam):
    A = np.c_[X, np.ones(len(y))]

    def f(w):
        r = A @ w - y
        ell = r**2 / lam
        lse = logsumexp(ell)
        p = np.exp(ell - lse)
        return lam * (lse - np.log(len(y))), A.T @ (p * 2 * r)

    w0 = np.linalg.lstsq(A, y, rcond=None)[0]
    res = minimize(f, w0, jac=True, method="L-BFGS-B",
                   options={"maxiter": 5000, "gtol": 1e-12, "ftol": 1e-15})
    return res.fun, f(w0)[0]


def test_kldro_regressor_on_diabetes_closes_most_of_the_gap_to_the_optimum():
    """``load_diabetes`` (442 rows, 10 features of scale 0.05, ``y`` standardised),
    lam=1, 20 epochs: objective 0.8073 measured, L-BFGS optimum 0.7710, the least-
    squares start 0.8399 (so about half the gap closed at 20 epochs; 0.7777 at the
    default 100). The same fit on ``X * 1e-4 + 1e4`` gives the same objective."""
    X, y = load_diabetes(return_X_y=True)
    y = (y - y.mean()) / y.std()
    opt, ols = _dro_optimum(X, y, 1.0)
    m = KLDRORegressor(lam=1.0, epochs=20, random_state=0).fit(X, y)
    val = m.objective(X, y)
    assert opt - 1e-6 <= val
    assert val < ols - 0.3 * (ols - opt)
    m2 = KLDRORegressor(lam=1.0, epochs=20, random_state=0).fit(X * 1e-4 + 1e4, y)
    assert abs(m2.objective(X * 1e-4 + 1e4, y) - val) < 1e-3
