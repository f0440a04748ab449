"""The CLoVE, IFCA and FedAvg estimators and the assignment rules, as typed user code."""

from typing import assert_type

import numpy as np
import torch
from torch import nn

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

    # the constructors' documented non-default values (unions, callables, sequences)
    def factory(n_features: int, n_outputs: int) -> nn.Module:
        return nn.Sequential(nn.Linear(n_features, 4), nn.ReLU(), nn.Linear(4, n_outputs))

    auto = CLoVE(n_clusters="auto", max_clusters=2, model="mlp", hidden_layer_sizes=[4, 3],
                 loss="mse", batch_size=None, optimizer="sgd", init="same",
                 first_assignment="random", loss_transform="sqrt", freeze_after=2,
                 participation=0.5, vectorize=False, device=torch.device("cpu"),
                 random_state=np.random.default_rng(0), n_rounds=1, lr=0.05)
    assert_type(auto.fit(clients), CLoVE)
    assert_type(CLoVE(model=factory, hidden_layer_sizes=4, loss_transform="log",
                      vectorize="auto", random_state=np.random.RandomState(0)), CLoVE)
    assert_type(CLoVE(model=lambda d, k: nn.Linear(d, k), loss="auto", device="cpu"), CLoVE)
    ifca_mlp = IFCA(n_clusters=2, model=factory, batch_size=None, vectorize=True,
                    init="same", first_assignment="random", freeze_after=1,
                    random_state=np.int64(0), n_rounds=1)
    assert_type(ifca_mlp.fit(clients), IFCA)
    assert_type(IFCA(model="logistic", loss="cross_entropy", hidden_layer_sizes=(8,),
                     device=torch.device("cpu"), random_state=None), IFCA)
    assert_type(FedAvg(model="autoencoder", loss="reconstruction", hidden_layer_sizes=[3],
                       optimizer="sgd", vectorize=False, device=torch.device("cpu"),
                       random_state=np.random.default_rng(0)), FedAvg)
    assert_type(FedAvg(model=nn.Linear, batch_size=None, vectorize=True), FedAvg)

    L = np.array([[0.1, 2.0], [0.2, 2.1], [3.0, 0.1], [2.9, 0.2]])
    assert_type(clove_assign(L, 2, random_state=0), np.ndarray)
    assert_type(clove_assign(L, 2, random_state=0, return_centers=True),
                tuple[np.ndarray, np.ndarray])
    assert_type(ifca_assign(L), np.ndarray)
    assert_type(choose_n_clusters(L, 2), int)
