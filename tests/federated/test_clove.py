"""CLoVE, IFCA and FedAvg estimators: paper claims, invariances, contract."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.metrics import adjusted_rand_score as ari

from mlpapers.datasets import make_federated_digits, make_federated_linear
from mlpapers.federated import IFCA, CLoVE, FedAvg

LIN = dict(n_clusters=4, local_epochs=10, lr=0.02, batch_size=100)


def _linear(seed, **kw):
    return make_federated_linear(n_clusters=4, n_clients_per_cluster=4, n_samples=500,
                                 random_state=seed, **kw)


@pytest.fixture(scope="module")
def linear():
    return _linear(0)


@pytest.fixture(scope="module")
def small():
    return make_federated_linear(n_clusters=2, n_clients_per_cluster=3, n_samples=60,
                                 n_features=5, random_state=1)


def _param_error(est, truth, coef):
    W = np.stack([m.weight.detach().numpy()[0] for m in est.models_])
    return max(np.linalg.norm(W[est.labels_[i]] - coef[k]) for i, k in enumerate(truth))


def _round_of_recovery(est):
    aris = [h["ari"] for h in est.history_]
    return next((t for t, a in enumerate(aris) if a == 1.0), None)


# -- paper claims -----------------------------------------------------------------
@pytest.mark.parametrize("init", ["random", "same"])
def test_clove_recovers_clusters_within_3_rounds_for_5_seeds(init):
    for seed in range(5):
        clients, truth, coef = _linear(seed)
        est = CLoVE(n_rounds=3, init=init, random_state=seed, **LIN).fit(clients, truth)
        assert _round_of_recovery(est) is not None, (seed, est.history_)
        assert ari(truth, est.labels_) == 1.0


def test_ifca_with_identical_init_fails_where_clove_succeeds():
    for seed in range(3):
        clients, truth, _ = _linear(seed)
        ifca = IFCA(n_rounds=3, init="same", random_state=seed, **LIN).fit(clients, truth)
        assert ari(truth, ifca.labels_) < 0.5
        # round 0 ties: every client picks model 0. Later a group may move to an untouched
        # initial model (2 models on 3 of 12 other seeds, ARI 0.29), so n_clusters_ == 1
        # held on these seeds only by luck
        assert ifca.history_[0]["n_models_used"] == 1


def test_clove_matches_or_beats_ifca_and_fedavg_fails(linear):
    clients, truth, coef = linear
    clove = CLoVE(n_rounds=4, random_state=0, **LIN).fit(clients, truth)
    ifca = IFCA(n_rounds=4, random_state=0, **LIN).fit(clients, truth)
    fedavg = FedAvg(n_rounds=4, local_epochs=10, lr=0.02, random_state=0).fit(clients)
    assert ari(truth, clove.labels_) >= ari(truth, ifca.labels_)
    assert _param_error(clove, truth, coef) < 1e-2
    assert _param_error(fedavg, truth, coef) > 0.5
    assert (fedavg.labels_ == 0).all() and len(fedavg.models_) == 1


def test_autoencoder_variant_recovers_rotation_clusters_on_digits():
    for seed in range(2):
        clients, truth = make_federated_digits("rotation", n_clusters=2, n_samples=80,
                                               random_state=seed)
        est = CLoVE(n_clusters=2, model="autoencoder", hidden_layer_sizes=(8,), n_rounds=6,
                    local_epochs=5, lr=0.02, batch_size=40, random_state=seed)
        est.fit([X for X, _ in clients], truth)
        assert est.loss_ == "reconstruction"
        assert ari(truth, est.labels_) == 1.0
        rec = est.predict(clients[0][0], client=0)
        assert rec.shape == clients[0][0].shape


def test_label_swap_digits_clove_beats_fedavg_accuracy():
    clients, truth = make_federated_digits("label_swap", n_clusters=3, n_samples=100,
                                           random_state=0)
    train = [(X[:80], y[:80]) for X, y in clients]
    test = [(X[80:], y[80:]) for X, y in clients]
    kw = dict(model="logistic", n_rounds=8, local_epochs=5, lr=0.05, batch_size=40,
              random_state=0)
    clove = CLoVE(n_clusters=3, **kw).fit(train, truth)
    fedavg = FedAvg(**kw).fit(train)
    assert ari(truth, clove.labels_) == 1.0
    assert clove.score(test) >= fedavg.score(test) + 0.1
    assert set(np.unique(clove.predict(test[0][0], client=0))) <= set(range(10))


# -- invariances and equivalences ----------------------------------------------------------
def test_client_order_invariance(linear):
    clients, truth, _ = linear
    perm = np.random.default_rng(0).permutation(len(clients))
    a = CLoVE(n_rounds=3, random_state=0, **LIN).fit(clients)
    b = CLoVE(n_rounds=3, random_state=0, **LIN).fit([clients[i] for i in perm])
    assert ari(a.labels_[perm], b.labels_) == 1.0
    X = clients[0][0][:20]
    j = int(np.flatnonzero(perm == 0)[0])
    np.testing.assert_allclose(a.predict(X, client=0), b.predict(X, client=j), atol=0.05)


def test_determinism(small):
    clients, truth, _ = small
    a = CLoVE(n_rounds=2, local_epochs=3, random_state=3).fit(clients)
    b = CLoVE(n_rounds=2, local_epochs=3, random_state=3).fit(clients)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    for ma, mb in zip(a.models_, b.models_):
        for pa, pb in zip(ma.parameters(), mb.parameters()):
            torch.testing.assert_close(pa, pb, rtol=0, atol=0)


def test_one_cluster_equals_fedavg(small):
    clients, _, _ = small
    kw = dict(n_rounds=2, local_epochs=3, lr=0.05, batch_size=16, random_state=0)
    a = CLoVE(n_clusters=1, **kw).fit(clients)
    b = FedAvg(**kw).fit(clients)
    for pa, pb in zip(a.models_[0].parameters(), b.models_[0].parameters()):
        torch.testing.assert_close(pa, pb)
    np.testing.assert_allclose(a.loss_vectors_, b.loss_vectors_, rtol=1e-6)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_vectorised_and_loop_paths_agree(small, optimizer):
    clients, truth, _ = small
    kw = dict(n_clusters=2, n_rounds=3, local_epochs=3, lr=0.05, batch_size=16,
              optimizer=optimizer, random_state=0)
    # unequal client sizes exercise the padding and the inactive-client steps
    clients = [(X[: 30 + 5 * i], y[: 30 + 5 * i]) for i, (X, y) in enumerate(clients)]
    a = CLoVE(vectorize=True, **kw).fit(clients, truth)
    b = CLoVE(vectorize=False, **kw).fit(clients, truth)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_allclose(a.loss_vectors_, b.loss_vectors_, rtol=1e-4, atol=1e-6)
    for ma, mb in zip(a.models_, b.models_):
        for pa, pb in zip(ma.parameters(), mb.parameters()):
            torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-5)


def test_callable_model_with_batchnorm_uses_the_loop_path():
    clients, truth = make_federated_digits("rotation", n_clusters=2, n_clients_per_cluster=2,
                                           n_samples=40, random_state=0)

    def net(d, k):
        return torch.nn.Sequential(torch.nn.Linear(d, 16), torch.nn.BatchNorm1d(16),
                                   torch.nn.ReLU(), torch.nn.Linear(16, k))

    est = CLoVE(n_clusters=2, model=net, n_rounds=2, lr=0.05, random_state=0)
    est.fit(clients, truth)
    assert est.loss_ == "cross_entropy" and len(est.models_) == 2
    assert est.predict(clients[0][0], client=0).shape == (40,)
    with pytest.raises(ValueError, match="buffers"):
        CLoVE(n_clusters=2, model=net, n_rounds=1, vectorize=True).fit(clients)


def test_identical_clients_and_empty_clusters_are_handled():
    X = np.random.default_rng(0).standard_normal((30, 3)).astype(np.float32)
    y = X @ np.array([1.0, -1.0, 0.5], dtype=np.float32)
    clients = [(X, y)] * 4
    est = CLoVE(n_clusters=3, n_rounds=3, local_epochs=2, init="same", random_state=0)
    est.fit(clients)
    assert est.labels_.min() >= 0 and est.labels_.max() < 3
    assert np.isfinite(est.loss_vectors_).all()


def test_partial_participation_and_freeze(linear):
    clients, truth, _ = linear
    est = CLoVE(n_rounds=8, participation=0.5, freeze_after=2, random_state=0, **LIN)
    est.fit(clients, truth)
    assert all(h["n_participants"] == 8 for h in est.history_)
    assert est.history_[-1]["frozen"]
    frozen = [h["frozen"] for h in est.history_]
    assert frozen == sorted(frozen)  # once frozen, always frozen
    first = frozen.index(True)  # frozen from the start of that round: no loss vectors
    assert all("loss" not in h for h in est.history_[first:])
    assert all("loss" in h for h in est.history_[:first])
    # ARI = 1 held here but not on 4 of seeds 1-16: a sample of clients missing a group
    # makes k-means with n_clusters split another group, whose half then overwrites the
    # absent group's model (see the user guide's limitations); the paper's rule, kept.
    assert ari(truth, est.labels_) > 0.5


def test_unknown_number_of_clusters():
    clients, truth, _ = make_federated_linear(n_clusters=3, n_clients_per_cluster=4,
                                              random_state=0)
    est = CLoVE(n_clusters="auto", max_clusters=6, n_rounds=4, local_epochs=25, lr=0.01,
                random_state=0).fit(clients, truth)
    assert len(est.models_) == 6
    # The silhouette rule may merge two groups, and a merged pair then shares a model
    # whose losses no longer tell them apart (only the untouched random models do):
    # seeds 1-12 ended with 2 clusters (ARI 0.52) on 6 of 12, so the full recovery of
    # this seed is luck. No seed split a true group or ended with more than 3 clusters.
    for k in range(3):
        assert len(np.unique(est.labels_[truth == k])) == 1
    assert est.n_clusters_ in (2, 3)
    assert est.history_[-1]["n_models_used"] == est.n_clusters_


# -- API -------------------------------------------------------------------------------------
def test_assign_score_and_predict(linear):
    clients, truth, coef = linear
    est = CLoVE(n_rounds=3, random_state=0, **LIN).fit(clients)
    rng = np.random.default_rng(5)
    for k in range(4):
        Xn = rng.standard_normal((50, 20)).astype(np.float32)
        model = est.assign(Xn, Xn @ coef[k])
        assert model == est.labels_[np.flatnonzero(truth == k)[0]]
    assert est.score(clients) > 0.99
    pred = est.predict(torch.as_tensor(clients[0][0]), client=0)
    assert isinstance(pred, np.ndarray) and pred.shape == (500,)
    with pytest.raises(ValueError, match="client="):
        est.predict(clients[0][0])
    with pytest.raises(ValueError, match="client must be"):
        est.predict(clients[0][0], client=99)
    with pytest.raises(ValueError, match="features|shape"):
        est.predict(np.ones((3, 4)), client=0)
    with pytest.raises(ValueError, match="one entry per training client"):
        est.score(clients[:3])


def test_save_load_and_pickle_round_trip(small, tmp_path):
    clients, _, _ = small
    est = CLoVE(n_rounds=2, local_epochs=2, random_state=0).fit(clients)
    path = tmp_path / "clove.pt"
    est.save(path)
    loaded = CLoVE.load(path)
    X = clients[0][0]
    np.testing.assert_allclose(loaded.predict(X, client=0), est.predict(X, client=0))
    np.testing.assert_array_equal(loaded.labels_, est.labels_)
    assert loaded.get_params() == est.get_params()
    again = pickle.loads(pickle.dumps(est))
    np.testing.assert_allclose(again.predict(X, cluster=1), est.predict(X, cluster=1))
    with pytest.raises(TypeError):
        IFCA.load(path)


def test_classification_save_load(tmp_path):
    clients, _ = make_federated_digits("label_swap", n_clusters=2, n_clients_per_cluster=2,
                                       n_samples=30, random_state=0)
    clients = [(X, y + 10) for X, y in clients]  # non-contiguous labels
    est = IFCA(n_clusters=2, model="mlp", hidden_layer_sizes=(8,), n_rounds=1,
               random_state=0).fit(clients)
    est.save(tmp_path / "m.pt")
    loaded = IFCA.load(tmp_path / "m.pt")
    np.testing.assert_array_equal(loaded.classes_, np.arange(10, 20))
    np.testing.assert_array_equal(loaded.predict(clients[1][0], client=1),
                                  est.predict(clients[1][0], client=1))


def test_a_hidden_layer_of_width_one_is_a_valid_mlp():
    # the smallest positive width (the check refuses 0 and negatives only)
    est = FedAvg(model="mlp", hidden_layer_sizes=1, n_rounds=1, random_state=0).fit(_pairs())
    assert [p.shape for p in est.models_[0].parameters()][0][0] == 1


def test_verbose_history_and_unfitted():
    with pytest.raises(NotFittedError):
        CLoVE().predict(np.ones((2, 2)), client=0)
    clients, truth, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2,
                                              n_samples=20, n_features=3, random_state=0)
    est = CLoVE(n_rounds=2, verbose=1, random_state=0).fit(clients, truth)
    assert [h["round"] for h in est.history_] == [0, 1]
    assert {"loss", "ari", "time_s", "n_participants"} <= set(est.history_[0])


# -- bad input ---------------------------------------------------------------------------------
def _pairs(n=3, d=2, m=10, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((m, d)), rng.standard_normal(m)) for _ in range(n)]


@pytest.mark.parametrize(
    "clients, match",
    [
        (np.ones((3, 2)), "list"),
        ([], "at least one"),
        (_pairs(n=2), "n_clusters=3"),
        ([*_pairs(n=2), (np.ones((5, 3)), np.ones(5))], r"clients\[2\]"),
        ([*_pairs(n=2), (np.ones((0, 2)), np.ones(0))], r"0 sample"),
        ([*_pairs(n=2), (np.full((4, 2), np.nan), np.ones(4))], "NaN"),
        ([*_pairs(n=2), (np.ones((4, 2)), np.array([1.0, np.nan, 1, 1]))], "NaN"),
        ([*_pairs(n=2), (np.ones((4, 2)), np.ones(5))], "match X"),
        ([*_pairs(n=2), np.ones((4, 2))], "mix"),
    ],
)
def test_bad_clients_raise_clear_errors(clients, match):
    with pytest.raises((ValueError, TypeError), match=match):
        CLoVE(n_clusters=3, n_rounds=1).fit(clients)


@pytest.mark.parametrize(
    "params, match",
    [
        (dict(n_rounds=0), "n_rounds"),
        (dict(n_rounds=2.5), "n_rounds"),
        (dict(local_epochs=1.5), "local_epochs"),
        (dict(n_init=2.5), "n_init"),
        (dict(lr=-1.0), "lr"),
        (dict(init="zeros"), "init"),
        (dict(first_assignment="x"), "first_assignment"),
        (dict(participation=1.5), "participation"),
        (dict(model="cnn"), "model"),
        (dict(optimizer="lbfgs"), "optimizer"),
        (dict(n_clusters="many"), "n_clusters"),
        (dict(loss_transform="exp"), "loss_transform"),
        (dict(freeze_after=0), "freeze_after"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_bad_params_raise(params, match):
    with pytest.raises((ValueError, TypeError), match=match):
        CLoVE(**params).fit(_pairs())


def test_cluster_labels_length_checked():
    with pytest.raises(ValueError, match="cluster_labels"):
        CLoVE(n_rounds=1).fit(_pairs(), cluster_labels=[0, 1])


def test_cluster_labels_shape_and_kind_checked():
    """A 2-D table was flattened into one label per client, and a None failed inside
    scikit-learn's ARI with a bare TypeError; a column of labels is one per client."""
    clients = _pairs(n=4)
    n = len(clients)
    truth = np.arange(n) % 2
    kw = dict(n_clusters=2, n_rounds=1, random_state=0)
    ari = CLoVE(**kw).fit(clients, cluster_labels=truth).history_[-1]["ari"]
    assert CLoVE(**kw).fit(clients, cluster_labels=truth[:, None]).history_[-1]["ari"] == ari
    named = np.where(truth == 0, "a", "b")
    assert CLoVE(**kw).fit(clients, cluster_labels=named).history_[-1]["ari"] == ari
    for bad, match in [(truth.reshape(2, -1), rf"must have shape \({n},\), one label per "
                                              rf"client, got \(2, {n // 2}\)"),
                       ([0] * (n - 1) + [None], "must be labels of one orderable kind"),
                       (np.r_[truth[:-1], np.nan], "must not hold NaN")]:
        with pytest.raises(ValueError, match="^cluster_labels " + match):
            CLoVE(**kw).fit(clients, cluster_labels=bad)


def test_cross_entropy_on_continuous_targets_names_the_loss():
    with pytest.raises(ValueError, match=r"^loss='cross_entropy' needs class labels y"):
        CLoVE(n_rounds=1, loss="cross_entropy").fit(_pairs())
