"""Acceptance tests of issue #5 read literally, for promises no other test covered."""

import numpy as np
import pytest

from mlpapers.datasets import make_federated_digits, make_federated_linear
from mlpapers.federated import CLoVE


def test_unsupervised_clients_as_x_alone_or_x_none_pairs_agree():
    """"fit(clients, ...) where clients is a list of (X, y) pairs (or X alone / (X, None)
    for unsupervised)": both forms give the same fit."""
    clients, _ = make_federated_digits(kind="rotation", n_clusters=2, n_clients_per_cluster=2,
                                       n_samples=30, random_state=1)
    Xs = [X for X, _ in clients]
    kw = dict(n_clusters=2, model="autoencoder", n_rounds=2, random_state=0)
    a = CLoVE(**kw).fit(Xs)
    b = CLoVE(**kw).fit([(X, None) for X in Xs])
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.loss_vectors_, b.loss_vectors_)
    np.testing.assert_array_equal(a.predict(Xs[0], client=0), b.predict(Xs[0], client=0))
    assert a.assign(Xs[1]) == b.assign(Xs[1], None)


@pytest.mark.parametrize("arg", ["client", "cluster"])
def test_predict_refuses_a_bool_index(arg):
    """"predict(X, client=i)": a bool is not a client index (client=True raised numpy's
    'only 0-dimensional arrays can be converted' and cluster=True chose model 1)."""
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=20,
                                          n_features=3, random_state=0)
    est = CLoVE(n_clusters=2, n_rounds=1, random_state=0).fit(clients)
    with pytest.raises(ValueError, match=f"{arg} must be an integer"):
        est.predict(clients[0][0], **{arg: True})
