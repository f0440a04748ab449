"""``score`` checks held-out labels as ``assign`` does.

Regressions: string-trained labels scored against integer labels gave accuracy 0.0
silently; a held-out client of one sample made the R^2 mean NaN (with scikit-learn's
warning); targets of another width failed with scikit-learn's raw message.
"""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_digits

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import CLoVE


def _digit_clients(dtype):
    X, y = load_digits(return_X_y=True)
    X = X / 16
    return [(X[i * 100:(i + 1) * 100], y[i * 100:(i + 1) * 100].astype(dtype))
            for i in range(4)]


def test_labels_of_another_kind_than_in_fit_are_refused():
    clients = _digit_clients(str)
    est = CLoVE(n_clusters=2, model="logistic", random_state=0, n_rounds=5,
                local_epochs=3).fit(clients)
    assert est.score(clients) > 0.5
    with pytest.raises(ValueError, match="labels of client 0 are numbers, but CLoVE was "
                                         "fitted on strings"):
        est.score([(X, y.astype(int)) for X, y in clients])


def _linear():
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=3,
                                          n_samples=40, random_state=0)
    return clients, CLoVE(n_clusters=2, random_state=0, n_rounds=3).fit(clients)


def test_a_one_sample_client_is_refused_for_r2():
    clients, est = _linear()
    held = [(X[:1], y[:1]) if i == 0 else (X, y) for i, (X, y) in enumerate(clients)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="at least 2 samples per client.*client 0 has 1"):
            est.score(held)
    two = [(X[:2], y[:2]) for X, y in clients]
    assert np.isfinite(est.score(two))


def test_targets_of_another_width_name_the_fitted_width():
    clients, est = _linear()
    with pytest.raises(ValueError, match=r"y of client 0 has 2 output\(s\) per sample, but "
                                         "CLoVE was fitted on 1"):
        est.score([(X, np.c_[y, y]) for X, y in clients])
