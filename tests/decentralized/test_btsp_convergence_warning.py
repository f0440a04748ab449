"""DecentralizedSGD warns, as CLoVE / IFCA / FedAvg do, when the average model did not learn."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

from mlpapers.decentralized import DecentralizedSGD

X, Y = make_classification(400, 8, random_state=0)


def _entropy(y):
    p = np.bincount(y) / len(y)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def test_features_offset_by_1e6_warn_instead_of_a_silent_constant_model():
    # before: a final loss of 1.4e11, accuracy 0.50, no warning
    with pytest.warns(ConvergenceWarning, match="more than twice") as record:
        model = DecentralizedSGD(n_nodes=8, random_state=0).fit(X + 1e6, Y)
    assert model.history_[-1]["loss"] > 2 * _entropy(Y)
    assert record[0].filename == __file__            # points at the caller's fit


def test_standardised_features_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        model = DecentralizedSGD(n_nodes=8, random_state=0).fit(X, Y)
    assert model.history_[-1]["loss"] < _entropy(Y)


def test_the_reference_is_the_eval_set_entropy():
    """With ``eval_set`` the recorded loss is on it, so the constant predictor's loss is
    that of its class frequencies (an eval set of one class: no reference, no warning)."""
    one_class = (X[Y == 1][:50] + 1e6, Y[Y == 1][:50])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        DecentralizedSGD(n_nodes=8, n_rounds=20, random_state=0).fit(
            X + 1e6, Y, eval_set=one_class)
