"""PartialAUCClassifier: a fit ending above its start warns, one-class ``score`` and
overflowing scores are clear errors."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning

from mlpapers.optim import PartialAUCClassifier


@pytest.fixture(scope="module")
def data():
    return load_breast_cancer(return_X_y=True)


def test_init_objective_is_the_objective_of_the_zero_scorer(data):
    X, y = data
    clf = PartialAUCClassifier(epochs=2, margin=0.5, random_state=0).fit(X, y)
    # w = 0: every pair loss is margin^2, and lam log mean exp(c / lam) = c
    assert clf.init_objective_ == pytest.approx(0.25, rel=1e-12)


def test_a_fit_ending_above_its_start_warns_and_a_converging_one_does_not(data):
    X, y = data
    with pytest.warns(ConvergenceWarning, match="ended above its starting objective"):
        bad = PartialAUCClassifier(lam=0.01, random_state=0).fit(X, y)
    assert bad.loss_curve_[-1] > bad.init_objective_
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        good = PartialAUCClassifier(random_state=0).fit(X, y)
    assert good.loss_curve_[-1] < good.init_objective_


def test_score_of_one_class_is_an_error(data):
    X, y = data
    clf = PartialAUCClassifier(epochs=2, random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="score needs samples of both classes"):
        clf.score(X[y == 0], y[y == 0])
    assert 0.0 <= clf.score(X, y) <= 1.0


def test_scores_overflowing_float32_name_the_learning_rate(data):
    X, y = data
    with pytest.raises(FloatingPointError, match="scores overflowed float32; lower lr"):
        PartialAUCClassifier(lr=1e38, epochs=5, random_state=0).fit(X, y)


def test_partial_fit_names_the_classes_for_unknown_labels():
    # the first call's error said "not seen in fit", though no fit ran
    from mlpapers.optim import SCENTClassifier

    X = np.random.default_rng(0).random((30, 3))
    with pytest.raises(ValueError, match=r"not seen in the classes of partial_fit: \[2\]"):
        SCENTClassifier(n_negatives=1).partial_fit(X, np.arange(30) % 3, classes=[0, 1])
