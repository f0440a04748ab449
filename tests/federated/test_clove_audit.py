"""Regression tests from the adversarial audit of the CLoVE public API."""

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_federated_digits, make_federated_linear
from mlpapers.federated import CLoVE, choose_n_clusters, clove_assign

L = np.array([[0.1, 2.0], [0.2, 2.1], [3.0, 0.1], [2.9, 0.2]])


@pytest.fixture(scope="module")
def clients():
    return make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=30,
                                 random_state=0)[0]


def _fast(**kw):
    return CLoVE(**{**dict(n_clusters=2, n_rounds=2, local_epochs=2, lr=0.05,
                           random_state=0), **kw})


def test_fit_accepts_tensors_that_require_grad(clients):
    # (X, y) tensor pairs with requires_grad raised "Can't call numpy() on Tensor..."
    ref = _fast().fit(clients)
    est = _fast().fit([(torch.tensor(X, requires_grad=True), torch.tensor(y))
                       for X, y in clients])
    np.testing.assert_array_equal(est.labels_, ref.labels_)
    np.testing.assert_allclose(est.predict(clients[0][0], client=0),
                               ref.predict(clients[0][0], client=0), rtol=1e-6)


def test_classification_model_rejects_continuous_targets(clients):
    # each distinct float became its own class before (240 "classes")
    with pytest.raises(ValueError, match="continuous"):
        _fast(model="logistic").fit(clients)
    with pytest.raises(ValueError, match="continuous"):
        _fast(model="mlp", loss="cross_entropy", hidden_layer_sizes=(4,)).fit(clients)


def test_hidden_layer_sizes_none_is_named(clients):
    with pytest.raises(ValueError, match="hidden_layer_sizes"):
        _fast(model="mlp", hidden_layer_sizes=None).fit(clients)


def test_assignment_kernels_validate_their_arguments():
    L_grad = torch.tensor(L, requires_grad=True)
    np.testing.assert_array_equal(clove_assign(L_grad, 2, random_state=0),
                                  clove_assign(L, 2, random_state=0))
    with pytest.raises(TypeError, match="n_clusters"):
        clove_assign(L, 2.5)  # silently truncated to 2 before
    assert clove_assign(L, np.int64(2), random_state=0).tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="max_clusters"):
        choose_n_clusters(L, 0)  # returned 1 before


def test_callable_model_with_wrong_output_is_rejected(clients):
    # a model with 2 outputs for 1 target trained silently (MSE broadcast) before
    with pytest.raises(ValueError, match=r"shape \(batch, 1\)"):
        _fast(model=lambda d, o: torch.nn.Linear(d, o + 1)).fit(clients)
    with pytest.raises(ValueError, match="model must accept inputs"):
        _fast(model=lambda d, o: torch.nn.Linear(d + 1, o)).fit(clients)
    bn = torch.nn.BatchNorm1d(20)
    est = _fast(model=lambda d, o: torch.nn.Sequential(bn, torch.nn.Linear(d, o)),
                vectorize=False).fit(clients)  # the one-sample probe runs in eval mode
    assert est.labels_.shape == (len(clients),)


@pytest.mark.parametrize("reps", [2, 3])
def test_choose_n_clusters_counts_repeated_loss_vectors(reps):
    # Candidates stopped at n_distinct - 1, so K separated groups of identical loss
    # vectors (e.g. clients holding the same data) could never give K clusters.
    groups = np.array([[0.1, 5.0, 5.0, 5.0], [5.0, 0.1, 5.0, 5.0],
                       [5.0, 5.0, 0.1, 5.0], [5.0, 5.0, 5.0, 0.1]])
    for k in (3, 4):
        Lk = np.repeat(groups[:k, :k], reps, axis=0)
        assert choose_n_clusters(Lk, 6) == k
        # a jitter far below the group separation must not change the answer
        jitter = 1e-9 * np.random.default_rng(0).random(Lk.shape)
        assert choose_n_clusters(Lk + jitter, 6) == k
    # the silhouette needs k < n_clients: all-distinct rows still stop at n - 1
    assert choose_n_clusters(groups[:3, :3], 6) == 2
    assert choose_n_clusters(np.ones((4, 3)), 6) == 1


def test_unknown_k_separates_clusters_of_identical_clients():
    # three clusters of three clients holding the same data: the unknown-K mode kept
    # two clusters forever (ARI 0.5) because k = n_distinct was never a candidate
    base, _, _ = make_federated_linear(n_clusters=3, n_clients_per_cluster=1, n_samples=100,
                                       random_state=0)
    truth = np.repeat(np.arange(3), 3)
    est = CLoVE(n_clusters="auto", max_clusters=5, n_rounds=2, local_epochs=10, lr=0.05,
                random_state=0).fit([base[k] for k in truth], truth)
    assert est.n_clusters_ == 3
    assert est.history_[-1]["ari"] == 1.0


def test_label_swap_digits_rejects_more_clusters_than_permutations():
    # one swap gives 1 + C(10, 2) = 46 distinct label permutations: 47 clusters made
    # the rejection sampler of distinct permutations loop forever
    clients, labels = make_federated_digits("label_swap", n_clusters=46, n_swaps=1,
                                            n_clients_per_cluster=1, n_samples=2,
                                            random_state=0)
    assert len(clients) == 46
    with pytest.raises(ValueError, match="only 46 distinct"):
        make_federated_digits("label_swap", n_clusters=47, n_swaps=1,
                              n_clients_per_cluster=1, n_samples=2, random_state=0)
    with pytest.raises(ValueError, match="only 946 distinct"):
        make_federated_digits("label_swap", n_clusters=947, n_swaps=5,
                              n_clients_per_cluster=1, n_samples=1, random_state=0)
