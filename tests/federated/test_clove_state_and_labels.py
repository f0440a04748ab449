"""One copy of the fitted models; label shapes and targets read alike in fit, score and
assign; participation counts and n_init checked up front."""

import pickle

import numpy as np
import pytest
import torch

from mlpapers.federated import CLoVE, FedAvg


def _classification_clients(seed=0):
    rng = np.random.default_rng(seed)
    clients = []
    for i in range(4):
        X = rng.normal(size=(40, 4))
        clients.append((X, ((X[:, 0] > 0) ^ (i % 2)).astype(int)))
    return clients


@pytest.fixture(scope="module")
def classifier():
    return CLoVE(n_clusters=2, model="logistic", n_rounds=5, local_epochs=5, lr=0.1,
                 random_state=0).fit(_classification_clients())


def test_score_and_assign_refuse_column_labels_as_fit_does(classifier):
    # score broadcast (n,) predictions against (n, 1) labels: 0.506 for 0.975, silently;
    # assign failed inside torch ("0D or 1D target tensor expected")
    clients = _classification_clients()
    with pytest.raises(ValueError, match=r"1D class labels y for every client \(clients\[0\] "
                                         r"has shape \(40, 1\)\)"):
        classifier.score([(X, y[:, None]) for X, y in clients])
    with pytest.raises(ValueError, match=r"1D class labels y, got shape \(40, 1\)"):
        classifier.assign(clients[0][0], clients[0][1][:, None])
    with pytest.raises(ValueError, match="1D class labels y"):
        CLoVE(n_clusters=2, model="logistic", n_rounds=1).fit(
            [(X, y[:, None]) for X, y in clients])


def test_edited_models_reach_assign_save_and_pickle(tmp_path):
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(s, 4)), rng.normal(size=s)) for s in (12, 5, 30, 3)]
    est = CLoVE(n_clusters=2, n_rounds=2, random_state=0).fit(clients)
    X = clients[0][0]
    with torch.no_grad():  # a user's edit (fine-tuning) of one model
        est.models_[0].weight.zero_()
        est.models_[0].bias.fill_(1000.0)
    expected = est.predict(X, cluster=0)
    assert np.all(expected == 1000.0)
    est.save(tmp_path / "m.pt")
    np.testing.assert_array_equal(CLoVE.load(tmp_path / "m.pt").predict(X, cluster=0), expected)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(est)).predict(X, cluster=0),
                                  expected)
    # assign ranks the models on their current weights: model 0 now predicts 1000
    for Xc, yc in clients:
        losses = [np.mean((est.predict(Xc, cluster=j) - yc) ** 2) for j in range(2)]
        assert est.assign(Xc, yc) == int(np.argmin(losses))


def test_reconstruction_ignores_targets_in_score_and_assign_as_in_fit():
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(20, 5)) for _ in range(4)]
    est = CLoVE(n_clusters=2, model="autoencoder", n_rounds=2, random_state=0).fit(
        [(X, X[:, 0]) for X in Xs])
    assert est.score([(X, X[:, 0]) for X in Xs]) == est.score(Xs)
    assert est.assign(Xs[0], Xs[0][:, 0]) == est.assign(Xs[0])


@pytest.mark.parametrize("p, n, expected", [(0.07, 100, 7), (0.14, 100, 14),
                                            (0.28, 100, 28), (0.071, 100, 8)])
def test_participation_takes_the_ceiling_of_the_exact_share(p, n, expected):
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(5, 2)), rng.normal(size=5)) for _ in range(n)]
    est = FedAvg(participation=p, n_rounds=1, random_state=0).fit(clients)
    assert est.history_[0]["n_participants"] == expected


@pytest.mark.parametrize("n_init, error", [(0, ValueError), (1.5, TypeError), (-1, ValueError)])
def test_n_init_is_checked_before_any_round(n_init, error):
    clients = _classification_clients()
    for kw in ({"n_clusters": 1}, {"n_clusters": 2, "first_assignment": "random",
                                   "freeze_after": 1}):
        with pytest.raises(error, match="n_init must be"):
            CLoVE(n_init=n_init, n_rounds=1, **kw).fit(clients)
