"""CLoVE as a new user runs it on their own client split (session-8 usability)."""

import numpy as np
import pytest
import torch

from mlpapers.federated import CLoVE, FedAvg


def _rotated_blobs():
    # 8 clients in 2 groups; the second group sees the features mirrored
    rng = np.random.default_rng(0)
    clients, truth = [], []
    for c in range(8):
        y = rng.integers(0, 3, 60)
        X = rng.normal(size=(60, 4)) + np.eye(3, 4)[y] * 3.0
        if c % 2:
            X = -X
        clients.append((X, np.array(["a", "b", "c"])[y]))
        truth.append(c % 2)
    return clients, truth


def test_predict_proba_is_the_softmax_of_the_clients_model():
    clients, truth = _rotated_blobs()
    est = CLoVE(n_clusters=2, model="logistic", n_rounds=5, local_epochs=3,
                random_state=0).fit(clients, cluster_labels=truth)
    X = clients[3][0][:7]
    P = est.predict_proba(X, client=3)
    assert P.shape == (7, 3) and P.dtype == np.float32
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(est.classes_[P.argmax(1)], est.predict(X, client=3))
    # independent reference: softmax of the affine map of the assigned model
    lin = [m for m in est.models_[est.labels_[3]].modules() if isinstance(m, torch.nn.Linear)]
    W, b = lin[0].weight.detach().double().numpy(), lin[0].bias.detach().double().numpy()
    Z = X @ W.T + b
    ref = np.exp(Z - Z.max(1, keepdims=True))
    np.testing.assert_allclose(P, ref / ref.sum(1, keepdims=True), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(est.predict_proba(X, cluster=int(est.labels_[3])), P)
    single = FedAvg(model="logistic", n_rounds=2, random_state=0).fit(clients)
    assert single.predict_proba(X).shape == (7, 3)   # one model: no client= needed


def test_predict_proba_needs_the_cross_entropy_loss():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(20, 3)), rng.normal(size=20)) for _ in range(4)]
    est = CLoVE(n_clusters=2, model="linear", n_rounds=2, random_state=0)
    assert not hasattr(est, "predict_proba")  # a linear regression has no probabilities
    est.fit(clients)
    assert not hasattr(est, "predict_proba")  # duck typing (sklearn's available_if)
    with pytest.raises(AttributeError, match="predict_proba"):
        est.predict_proba(clients[0][0], client=0)
    assert hasattr(CLoVE(model="logistic"), "predict_proba")
    assert not hasattr(FedAvg(model="mlp", loss="mse"), "predict_proba")
