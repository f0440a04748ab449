"""The CLoVE, IFCA and FedAvg estimators and the assignment rules, as typed user code."""

from typing import assert_type

import numpy as np

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import (
    IFCA,
    CLoVE,
    FedAvg,
    choose_n_clusters,
    clove_assign,
    ifca_assign,
)


def check() -> None:
    clients, truth, _ = make_federated_linear(
        n_clusters=2, n_clients_per_cluster=2, n_samples=30, n_features=3, random_state=0)
    X, y = clients[0]

    clove = CLoVE(n_clusters=2, n_rounds=2, local_epochs=5, lr=0.05, random_state=0)
    assert_type(clove.fit(clients, cluster_labels=truth), CLoVE)
    assert_type(clove.predict(X, client=0), np.ndarray)
    assert_type(clove.predict(X, cluster=1), np.ndarray)
    assert_type(clove.assign(X, y), int)
    assert_type(clove.score(clients), float)

    ifca = IFCA(n_clusters=2, n_rounds=2, local_epochs=5, lr=0.05, random_state=0)
    assert_type(ifca.fit(clients), IFCA)
    assert_type(ifca.predict(X, client=0), np.ndarray)

    fedavg = FedAvg(n_rounds=2, local_epochs=5, lr=0.05, random_state=0)
    assert_type(fedavg.fit(clients), FedAvg)
    assert_type(fedavg.predict(X), np.ndarray)
    assert_type(fedavg.score(clients), float)

    L = np.array([[0.1, 2.0], [0.2, 2.1], [3.0, 0.1], [2.9, 0.2]])
    assert_type(clove_assign(L, 2, random_state=0), np.ndarray)
    assert_type(clove_assign(L, 2, random_state=0, return_centers=True),
                tuple[np.ndarray, np.ndarray])
    assert_type(ifca_assign(L), np.ndarray)
    assert_type(choose_n_clusters(L, 2), int)
