"""SCENTClassifier: convergence to the exact optimum, exact predictions, errors, persistence."""

import math

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError

from mlpapers.datasets import make_extreme_classification
from mlpapers.optim import SCENTClassifier
from mlpapers.optim.scent._common import minimize_lbfgs


@pytest.fixture(scope="module")
def problem():
    X, y = make_extreme_classification(600, 30, 8, noise=1.0, zipf_exponent=0.5, random_state=0)
    return X, y


def lbfgs_optimum(X, y, alpha):
    classes, yi = np.unique(y, return_inverse=True)
    Xt = torch.tensor(X, dtype=torch.float64)
    yt = torch.tensor(yi)
    W = torch.zeros(len(classes), X.shape[1], dtype=torch.float64, requires_grad=True)

    def f():
        return torch.nn.functional.cross_entropy(Xt @ W.T, yt) + 0.5 * alpha * (W * W).sum()

    minimize_lbfgs(f, [W])
    return float(f().detach())


def test_converges_to_lbfgs_optimum_of_exact_objective(problem):
    X, y = problem
    alpha = 1e-2
    f_star = lbfgs_optimum(X, y, alpha)
    C = len(np.unique(y))
    clf = SCENTClassifier(n_negatives=8, epochs=60, lr=0.3, batch_size=50, alpha=alpha,
                          log_alpha=math.log(C) - 2, random_state=0).fit(X, y)
    gap = clf.objective(X, y) - f_star
    assert -1e-6 < gap < 1e-2
    # the dual table tracks log (1/C) sum_k exp(z_k - z_y) at the final weights
    z = X.astype(np.float64) @ clf.coef_.T.astype(np.float64)
    yi = np.searchsorted(clf.classes_, y)
    s = z - z[np.arange(len(y)), yi][:, None]
    nu_star = np.log(np.mean(np.exp(s), axis=1))
    assert np.mean(np.abs(clf.nu_ - nu_star)) < 0.25
    # training curve (cross-entropy estimate) decreases
    assert clf.loss_curve_[-1] < clf.loss_curve_[0]


def test_all_negatives_is_exact_full_softmax_sgd(problem):
    """With every negative the sampled objective is exact, so BSGD = full-softmax SGD."""
    X, y = problem
    C = len(np.unique(y))
    clf = SCENTClassifier(n_negatives=C - 1, method="bsgd", epochs=1, lr=0.5,
                          batch_size=len(X), lr_schedule="constant").fit(X, y)
    Xt = torch.tensor(X, dtype=torch.float64)
    yt = torch.tensor(np.searchsorted(clf.classes_, y))
    W = torch.zeros(C, X.shape[1], dtype=torch.float64, requires_grad=True)
    torch.nn.functional.cross_entropy(Xt @ W.T, yt).backward()
    np.testing.assert_allclose(clf.coef_, -0.5 * W.grad.numpy(), atol=1e-6)


def test_predict_proba_is_exact_softmax(problem):
    X, y = problem
    clf = SCENTClassifier(n_negatives=4, epochs=2, temperature=0.5, fit_intercept=True,
                          random_state=0).fit(X, y)
    z = X.astype(np.float64) @ clf.coef_.T + clf.intercept_
    p = np.exp(z / 0.5 - (z / 0.5).max(1, keepdims=True))
    np.testing.assert_allclose(clf.predict_proba(X), p / p.sum(1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(X)), clf.predict_proba(X),
                               atol=1e-10)
    assert np.array_equal(clf.predict(X), clf.classes_[z.argmax(1)])
    assert clf.decision_function(X).shape == (len(X), len(clf.classes_))


@pytest.mark.parametrize("method", ["sox", "asgd", "umax", "asgd_softplus", "bsgd"])
def test_baselines_train(method, problem):
    X, y = problem
    clf = SCENTClassifier(n_negatives=8, method=method, epochs=5, lr=0.3,
                          random_state=0).fit(X, y)
    first = SCENTClassifier(n_negatives=8, epochs=0 + 1, lr=0.3, method=method,
                            random_state=0).fit(X, y)
    assert clf.objective(X, y) < first.objective(X, y) < math.log(len(clf.classes_))
    assert np.isnan(clf.nu_).all() == (method == "bsgd")


def test_determinism_and_seed_effect(problem):
    X, y = problem
    a = SCENTClassifier(n_negatives=4, epochs=2, random_state=3).fit(X, y)
    b = SCENTClassifier(n_negatives=4, epochs=2, random_state=3).fit(X, y)
    c = SCENTClassifier(n_negatives=4, epochs=2, random_state=4).fit(X, y)
    assert np.array_equal(a.coef_, b.coef_) and np.array_equal(a.nu_, b.nu_)
    assert not np.array_equal(a.coef_, c.coef_)


def test_partial_fit_matches_and_grows_table(problem):
    X, y = problem
    clf = SCENTClassifier(n_negatives=4, random_state=0)
    classes = np.unique(y)
    for _ in range(3):
        clf.partial_fit(X, y, classes=classes)
    assert clf.n_iter_ == 3 and len(clf.loss_curve_) == 3
    assert clf.loss_curve_[-1] < clf.loss_curve_[0]
    clf.partial_fit(X[:10], y[:10], sample_index=np.arange(1000, 1010))
    assert clf.nu_.shape == (1010,) and np.isnan(clf.nu_[600:1000]).all()
    with pytest.raises(ValueError, match="classes must be passed"):
        SCENTClassifier().partial_fit(X, y)


def test_bad_inputs(problem):
    X, y = problem
    C = len(np.unique(y))
    with pytest.raises(ValueError, match="n_negatives must be < n_classes"):
        SCENTClassifier(n_negatives=C).fit(X, y)
    Xn = X.copy()
    Xn[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        SCENTClassifier(n_negatives=2).fit(Xn, y)
    with pytest.raises(ValueError, match="method"):
        SCENTClassifier(method="adam", n_negatives=2).fit(X, y)
    with pytest.raises(NotFittedError):
        SCENTClassifier().predict(X)
    clf = SCENTClassifier(n_negatives=2, epochs=1).fit(X, y)
    with pytest.raises(ValueError, match="not seen in fit"):
        clf.objective(X[:3], np.array([0, 1, 10_000]))
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :3])
    with pytest.raises(FloatingPointError, match="diverged"):
        SCENTClassifier(n_negatives=2, method="asgd", lr=1e6, epochs=3,
                        random_state=0).fit(X, y)


def test_save_load_round_trip_and_resume(tmp_path, problem):
    X, y = problem
    clf = SCENTClassifier(n_negatives=4, epochs=2, random_state=0).fit(X, y.astype(str))
    path = tmp_path / "scent.pt"
    clf.save(path)
    back = SCENTClassifier.load(path)
    np.testing.assert_array_equal(back.predict(X), clf.predict(X))
    np.testing.assert_array_equal(back.nu_, clf.nu_)
    back.partial_fit(X, y.astype(str))  # resumes from the loaded weights and dual table
    assert back.n_iter_ == 3


def test_default_n_negatives_error_names_the_fix():
    # A new user's first SCENTClassifier() on a 3-class problem hits the n_negatives
    # check; the message must say which value works (n_classes - 1, the exact softmax).
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    y = np.array(["a", "b", "c"] * 10)
    with pytest.raises(ValueError, match=r"Set n_negatives=2 to use every class"):
        SCENTClassifier().fit(X, y)
    assert SCENTClassifier(n_negatives=2, epochs=2, random_state=0).fit(X, y).n_iter_ == 2


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_two_class_decision_over_temperature_is_the_log_odds(temperature):
    from scipy.special import expit

    X, y = make_extreme_classification(200, 2, 4, random_state=0)
    clf = SCENTClassifier(n_negatives=1, temperature=temperature, epochs=2,
                          random_state=0).fit(X, y)
    np.testing.assert_allclose(expit(clf.decision_function(X) / temperature),
                               clf.predict_proba(X)[:, 1], rtol=1e-10, atol=1e-12)
