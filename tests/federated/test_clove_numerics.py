"""Numerical robustness of CLoVE / IFCA / FedAvg: loss scale, ties, divergence, long runs."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from mlpapers.datasets import make_federated_linear
from mlpapers.federated.clove import IFCA, CLoVE, FedAvg, choose_n_clusters, clove_assign


def _loss_matrix(seed=0):
    """3 groups x 4 clients, 3 models: group g fits model g."""
    rng = np.random.default_rng(seed)
    base = np.array([[0.1, 2.0, 3.0], [2.0, 0.1, 3.0], [3.0, 2.0, 0.1]])
    return np.repeat(base, 4, axis=0) + rng.random((12, 3)) * 0.05


@pytest.mark.parametrize("k", [-1060, -700, -540, 520, 700, 1020])
def test_assignment_is_invariant_to_the_loss_scale(k):
    # k-means/Ward squared distances underflowed below ~1e-160 (every client in one
    # cluster, with a sklearn warning) and overflowed above ~1e154 (mis-clustering, or
    # "The condensed distance matrix must contain only finite values")
    L = _loss_matrix()
    ref, centers = clove_assign(L, 3, random_state=0, return_centers=True)
    assert adjusted_rand_score(np.repeat([0, 1, 2], 4), ref) == 1.0
    scaled = np.ldexp(L, k)  # exact rescaling
    got, got_centers = clove_assign(scaled, 3, random_state=0, return_centers=True)
    np.testing.assert_array_equal(got, ref)
    if k > -1000:  # far below, the scaled losses themselves are subnormal (rounded)
        np.testing.assert_array_equal(got_centers, np.ldexp(centers, k))
    assert choose_n_clusters(scaled, 6) == choose_n_clusters(L, 6) == 3
    for kk in range(1, 4):  # an embedding and matching losses of different scales
        want = clove_assign(L, kk, random_state=1)
        np.testing.assert_array_equal(clove_assign(scaled, kk, random_state=1,
                                                   match_losses=L), want)
        np.testing.assert_array_equal(clove_assign(L, kk, random_state=1,
                                                   match_losses=scaled), want)


def test_float32_losses_assign_like_their_float64_values():
    rng = np.random.default_rng(1)
    for t in range(20):
        L = _loss_matrix(t) * rng.choice([1e-30, 1.0, 1e30])
        L32 = L.astype(np.float32)
        np.testing.assert_array_equal(clove_assign(L32, 3, random_state=t),
                                      clove_assign(L32.astype(np.float64), 3, random_state=t))
        np.testing.assert_array_equal(clove_assign(L32, 3, random_state=t),
                                      clove_assign(L, 3, random_state=t))


def test_identical_clients_tie_exactly_and_a_single_client_works():
    L = np.repeat(np.array([[0.1, 2.0], [2.0, 0.1]]), 5, axis=0)
    a = clove_assign(L, 2, random_state=0)
    assert len(set(a[:5])) == 1 and len(set(a[5:])) == 1 and a[0] != a[5]
    assert clove_assign(np.ones((6, 3)), 3, random_state=0).tolist() == [0] * 6
    assert choose_n_clusters(np.ones((6, 3)), 4) == 1
    assert clove_assign(L[:1], 1).tolist() == [0]
    clients, _, _ = make_federated_linear(n_clusters=1, n_clients_per_cluster=1,
                                          n_samples=30, random_state=0)
    est = CLoVE(n_clusters=1, n_rounds=2, random_state=0).fit(clients)
    assert est.labels_.tolist() == [0] and np.isfinite(est.loss_vectors_).all()


@pytest.mark.parametrize("cls,optimizer,lr,match", [
    *[(cls, "adam", 1e30, r"diverged in round 0: the local update of client\(s\) \[0, 1,")
      for cls in (CLoVE, IFCA, FedAvg)],
    *[(cls, "sgd", 1e10, r"training loss of model \d on client \d+ is not finite in round 1")
      for cls in (CLoVE, IFCA)],
])
def test_divergence_raises_a_floating_point_error(cls, optimizer, lr, match):
    # CLoVE/IFCA failed with "loss_matrix contains NaN or infinity." (a loss matrix the
    # user never passed); FedAvg kept going and returned NaN models silently
    clients, _, _ = make_federated_linear(n_clusters=3, n_clients_per_cluster=2,
                                          n_samples=30, random_state=0)
    kw = {} if cls is FedAvg else {"n_clusters": 3}
    with pytest.raises(FloatingPointError, match=match + ".*lower lr"):
        cls(n_rounds=4, local_epochs=2, lr=lr, optimizer=optimizer, random_state=0,
            **kw).fit(clients)


@pytest.mark.parametrize("cls", [CLoVE, IFCA])
def test_a_client_whose_loss_overflows_float32_is_named(cls):
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=30, random_state=0)
    X, y = clients[2]
    clients[2] = (X, y * 1e25)  # finite in float32, its squared error is not
    with pytest.raises(FloatingPointError, match="on client 2 is not finite in round 0.*"
                                                 "overflows float32"):
        cls(n_clusters=2, n_rounds=2, random_state=0).fit(clients)


def test_fedavg_warns_on_an_overflowing_loss_and_keeps_training():
    # FedAvg's assignment ignores the losses: an inf (overflowed float32) loss is not a
    # divergence, the model still trains (CLoVE/IFCA cannot cluster on it and raise)
    clients, _, _ = make_federated_linear(n_clusters=1, n_clients_per_cluster=4,
                                          n_samples=50, random_state=0)
    clients = [(X, y * 1e19) for X, y in clients]
    with pytest.warns(RuntimeWarning, match="overflow float32"):
        est = FedAvg(n_rounds=30, optimizer="sgd", lr=1e-2, random_state=0).fit(clients)
    assert all(torch.isfinite(p).all() for m in est.models_ for p in m.parameters())
    X, y = (np.concatenate(a).astype(np.float64) for a in zip(*clients))
    resid = y - est.predict(X, cluster=0).astype(np.float64).ravel()
    assert 1 - resid.var() / y.var() > 0.3  # R^2 (in float64) of a model that did train


def test_divergence_in_the_last_round_is_not_returned_silently():
    # FedAvg's huge but finite weights after one step of lr=1e30: the infinite losses
    # are warned about (its assignment ignores losses, so it does not stop)
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                          n_samples=30, random_state=0)
    with pytest.warns(RuntimeWarning, match="overflow float32"):
        est = FedAvg(n_rounds=1, lr=1e30, random_state=0).fit(clients)
    assert np.isinf(est.loss_vectors_).any()


def test_long_run_stays_finite_and_the_clustering_stable():
    clients, truth, _ = make_federated_linear(n_clusters=3, n_clients_per_cluster=2,
                                              n_samples=40, random_state=0)
    est = CLoVE(n_clusters=3, n_rounds=60, lr=0.05, batch_size=None, random_state=0).fit(
        clients, cluster_labels=truth)
    h = est.history_
    assert all(np.isfinite(e["loss"]) for e in h)
    assert np.isfinite(est.loss_vectors_).all()
    assert all(torch.isfinite(p).all() for m in est.models_ for p in m.parameters())
    assert [e["ari"] for e in h[-40:]] == [1.0] * 40
    assert [e["n_models_used"] for e in h[-40:]] == [3] * 40
    # the loss of the assigned models keeps decreasing once the clusters are found
    assert h[-1]["loss"] < h[20]["loss"]


def test_flower_strategy_names_a_diverged_node(monkeypatch):
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord

    from mlpapers.federated.clove import _flower
    from mlpapers.federated.clove._flower import CLoVEStrategy

    sd = torch.nn.Linear(2, 1).state_dict()
    strategy = CLoVEStrategy(n_clusters=2)
    strategy.models_ = [ArrayRecord(dict(sd))] * 2
    strategy.labels_ = {10: 0, 11: 1}
    bad = {k: torch.full_like(v, float("nan")) for k, v in sd.items()}

    def reply(nid, state):
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=nid),
                               content={"metrics": {"num-examples": 5},
                                        "arrays": ArrayRecord(dict(state))})

    with pytest.raises(FloatingPointError, match="node 11 diverged in round 3"):
        strategy.aggregate_train(3, [reply(10, sd), reply(11, bad)])

    # a non-finite loss vector: named before the clustering sees it
    strategy = CLoVEStrategy(n_clusters=2, min_nodes=2)
    losses = {10: [0.1, 1.0], 11: [float("inf"), 0.2]}
    strategy._exchange = lambda grid, msgs, timeout: [
        SimpleNamespace(metadata=SimpleNamespace(src_node_id=nid),
                        content={"metrics": {"losses": v}}) for nid, v in losses.items()]
    grid = SimpleNamespace(get_node_ids=lambda: [10, 11])
    monkeypatch.setattr(_flower, "Message", lambda *a, **kw: SimpleNamespace())  # no run
    with pytest.raises(FloatingPointError, match="node 11 reported a non-finite loss for "
                                                 "model 0 in round 1"):
        strategy.start(grid, ArrayRecord(dict(sd)), num_rounds=1)


def test_hidden_layer_sizes_must_be_a_sequence():
    # a generator was consumed by the check: model="mlp" became a linear model (and a
    # stored generator would be empty at the next fit); a set has no layer order
    clients, _, _ = make_federated_linear(n_clusters=1, n_clients_per_cluster=2,
                                          n_samples=20, random_state=0)
    for given in ([8, 4], (8, 4), np.array([8, 4])):
        est = FedAvg(model="mlp", hidden_layer_sizes=given, n_rounds=1,
                     random_state=0).fit(clients)
        widths = [m.out_features for m in est.models_[0].modules()
                  if isinstance(m, torch.nn.Linear)]
        assert widths == [8, 4, 1]
    for bad in ((h for h in [8, 4]), iter([8, 4]), {8, 4}):
        with pytest.raises(ValueError, match="hidden_layer_sizes must be a sequence"):
            FedAvg(model="mlp", hidden_layer_sizes=bad, n_rounds=1).fit(clients)


def test_one_sample_as_a_vector_gets_the_reshape_hint():
    clients, _, _ = make_federated_linear(n_clusters=1, n_clients_per_cluster=2,
                                          n_samples=20, random_state=0)
    est = FedAvg(n_rounds=1, random_state=0).fit(clients)
    with pytest.raises(ValueError, match=r"one sample: pass X.reshape\(1, -1\)"):
        est.predict(clients[0][0][0], client=0)
