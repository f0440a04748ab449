"""A tensor's memory layout does not change results: the same values from numpy, from a
contiguous tensor and from a transposed one give bitwise-equal outputs."""

import numpy as np
import pytest
import torch

from mlpapers._utils import check_tensor
from mlpapers.datasets import make_federated_linear
from mlpapers.federated import CLoVE
from mlpapers.optim import KLDRORegressor, SCENTClassifier


def transposed_storage(X):
    """The values of ``X`` in a tensor whose storage is column-major."""
    return torch.from_numpy(np.ascontiguousarray(np.asarray(X).T)).T


def test_check_tensor_returns_a_contiguous_tensor():
    X = np.arange(12.0).reshape(3, 4)
    for value in (transposed_storage(X),
                  torch.zeros(2, 3, 4, 5).to(memory_format=torch.channels_last),
                  torch.arange(10.0)[::2]):
        out = check_tensor(value, ndim=None, dtype=None)
        assert out.is_contiguous()
        assert torch.equal(out, value)


def test_clove_predictions_do_not_depend_on_the_tensor_layout():
    # the transposed tensor's predictions differed by up to 1.2e-7 (another summation
    # order in the matmul)
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=30, random_state=0)
    est = CLoVE(n_clusters=2, n_rounds=2, random_state=0).fit(clients)
    X = clients[0][0][:5]
    np.testing.assert_array_equal(est.predict(transposed_storage(X), client=0),
                                  est.predict(X, client=0))


def scores(est, X):
    return est.decision_function(X) if hasattr(est, "decision_function") else est.predict(X)


@pytest.mark.parametrize("make", [
    lambda: SCENTClassifier(epochs=2, n_negatives=2, random_state=0),
    lambda: KLDRORegressor(epochs=2, random_state=0),
])
def test_scent_estimators_do_not_depend_on_the_tensor_layout(make):
    # KLDRORegressor's predictions differed by about 1e-7 for a transposed tensor
    rng = np.random.RandomState(0)
    X = rng.standard_normal((300, 50)).astype(np.float32)
    y = rng.randint(0, 3, 300)
    est = make().fit(X, y)
    np.testing.assert_array_equal(scores(est, transposed_storage(X)), scores(est, X))
    again = make().fit(transposed_storage(X), torch.from_numpy(y))
    np.testing.assert_array_equal(scores(again, X), scores(est, X))
