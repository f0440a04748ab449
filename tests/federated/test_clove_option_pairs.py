"""Option interactions of CLoVE, IFCA and FedAvg (session 18, combinatorial testing).

A pairwise covering array over the options that select a code path (every pair of
values of every two options appears in at least one configuration; built by the
deterministic greedy search of ``tests._pairwise``) is fitted on tiny federations, and
every fit is checked against the invariants that hold whatever the options: documented shapes and
types, finite losses, ``assign`` = the lowest-loss model, reproducibility, pickle and
``save``/``load``, ``set_params`` + refit, the vectorised path = the per-client loop,
one model = FedAvg. The regression tests of the defects the array found follow.
"""

import math
import pickle
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from torch import nn

from mlpapers.federated import IFCA, CLoVE, FedAvg
from mlpapers.federated.clove._engine import ClientData, Engine
from tests._pairwise import covering_array, uncovered_pairs

ESTIMATORS = {"CLoVE": CLoVE, "IFCA": IFCA, "FedAvg": FedAvg}


def bn_net(n_features, n_outputs):
    return nn.Sequential(nn.Linear(n_features, 6), nn.BatchNorm1d(6), nn.ReLU(),
                         nn.Linear(6, n_outputs))


def dropout_net(n_features, n_outputs):
    return nn.Sequential(nn.Linear(n_features, 6), nn.Dropout(0.3), nn.ReLU(),
                         nn.Linear(6, n_outputs))


# the code-path options, 2-4 values each (first: the default where there is one)
OPTIONS = {
    "est": ["CLoVE", "IFCA", "FedAvg"],
    "model": ["linear", "logistic", "mlp", "autoencoder", "bn", "dropout"],
    "n_clusters": [2, 1, "auto", "max"],
    "init": ["random", "same"],
    "first_assignment": ["loss", "random"],
    "loss_transform": [None, "sqrt", "log"],
    "batch_size": [100, None, 1, 5],
    "optimizer": ["adam", "sgd"],
    "participation": [1.0, 0.5],
    "freeze_after": [None, 1],
    "vectorize": ["auto", True, False],
    "sizes": ["equal", "unequal"],
    "X": ["float64", "float32", "tensor", "DataFrame"],
    "y": ["1d", "2d"],
}


CONFIGS = covering_array(OPTIONS)


def test_covering_array_covers_every_pair():
    assert uncovered_pairs(OPTIONS, CONFIGS) == []

TASK = {"linear": "mse", "bn": "mse", "logistic": "cross_entropy", "mlp": "cross_entropy",
        "dropout": "cross_entropy", "autoencoder": "reconstruction"}


def _clients(cfg, seed=0):
    rng = np.random.default_rng(seed)
    sizes = [8] * 6 if cfg["sizes"] == "equal" else [7, 13, 9, 6, 11, 8]
    W = rng.normal(size=(2, 3, 2))
    task = TASK[cfg["model"]]
    clients = []
    for i, m in enumerate(sizes):
        X = rng.normal(size=(m, 3))
        if task == "mse":
            y = X @ W[i % 2] if cfg["y"] == "2d" else X @ W[i % 2][:, 0]
        elif task == "cross_entropy":
            y = np.where(X @ W[i % 2][:, 0] > 0, "a", "b")
            y[:2] = ["a", "b"]
        else:
            y = None
        if cfg["X"] == "float32":
            X = X.astype(np.float32)
        elif cfg["X"] == "tensor":
            X = torch.as_tensor(X)
        elif cfg["X"] == "DataFrame":
            pd = pytest.importorskip("pandas")
            X = pd.DataFrame(X, columns=["a", "b", "c"])
        clients.append(X if y is None else (X, y))
    return clients, np.arange(len(sizes)) % 2


def _estimator(cfg):
    model = {"bn": bn_net, "dropout": dropout_net}.get(cfg["model"], cfg["model"])
    Est = ESTIMATORS[cfg["est"]]
    kw = dict(model=model, n_rounds=2, lr=0.05, batch_size=cfg["batch_size"],
              optimizer=cfg["optimizer"], participation=cfg["participation"],
              vectorize=cfg["vectorize"], hidden_layer_sizes=(4,), random_state=0)
    if Est is not FedAvg:
        k = cfg["n_clusters"]
        if k == "auto" and Est is not CLoVE:
            k = 2
        kw.update(n_clusters=6 if k == "max" else k, init=cfg["init"],
                  first_assignment=cfg["first_assignment"], freeze_after=cfg["freeze_after"])
        if Est is CLoVE:
            kw["loss_transform"] = cfg["loss_transform"]
            if k == "auto":
                kw["max_clusters"] = 3
    return Est(**kw)


def _same_fit(a, b):
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.loss_vectors_, b.loss_vectors_)
    assert a._states.keys() == b._states.keys()
    for k, v in a._states.items():
        torch.testing.assert_close(v, b._states[k], rtol=0, atol=0)


def _x(client):
    return client[0] if isinstance(client, tuple) else client


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_option_pairs_keep_every_invariant(cfg, tmp_path):
    clients, truth = _clients(cfg)
    est = _estimator(cfg)
    uses_bn = cfg["model"] == "bn"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # two rounds: not converged
        if uses_bn and (cfg["vectorize"] is True or cfg["batch_size"] == 1):
            # the only refused combinations: named parameter, before any training
            with pytest.raises(ValueError, match="vectorize=True|batch_size=1"):
                est.fit(clients, truth)
            return
        est.fit(clients, truth)
        n, task = len(clients), TASK[cfg["model"]]
        assert est.loss_ == task
        assert est.labels_.shape == (n,) and est.labels_.dtype == np.int64
        M = len(est.models_)
        assert est.loss_vectors_.shape == (n, M) and np.isfinite(est.loss_vectors_).all()
        assert 0 <= est.labels_.min() and est.labels_.max() < M
        assert est.n_clusters_ == len(np.unique(est.labels_))
        for h in est.history_:
            assert h["n_participants"] >= 1 and "ari" in h
            assert ("loss" in h) == (not h["frozen"])  # frozen rounds compute no losses
        X0 = _x(clients[0])
        pred = est.predict(X0, client=0)
        assert isinstance(pred, np.ndarray) and pred.shape[0] == len(X0)
        if task == "mse":
            assert pred.shape == ((len(X0), 2) if cfg["y"] == "2d" else (len(X0),))
        elif task == "cross_entropy":
            assert set(pred) <= {"a", "b"}
            proba = est.predict_proba(X0, client=0)
            np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-5)
        else:
            assert pred.shape == (len(X0), 3)
        assert math.isfinite(est.score(clients))
        # assign: the lowest-loss model (the loss vectors are computed the same way)
        new = clients[0] if task != "reconstruction" else (clients[0], None)
        assert est.assign(*new) == int(np.argmin(est.loss_vectors_[0]))
        # same random_state, same fit, also after set_params on a fit with other ones
        other = clone(est).set_params(n_rounds=1, lr=0.2, random_state=5).fit(clients)
        _same_fit(est, other.set_params(**est.get_params()).fit(clients, truth))
        assert set(other.__dict__) == set(est.__dict__)
        # persistence keeps the predictions
        np.testing.assert_array_equal(pickle.loads(pickle.dumps(est)).predict(X0, client=0),
                                      pred)
        if isinstance(est.model, str):
            est.save(tmp_path / "m.pt")
            loaded = type(est).load(tmp_path / "m.pt")
            np.testing.assert_array_equal(loaded.predict(X0, client=0), pred)
            np.testing.assert_array_equal(loaded.labels_, est.labels_)
            # the vectorised simulation equals the per-client loop (rounding aside)
            if cfg["vectorize"] is not False:
                loop = clone(est).set_params(vectorize=False).fit(clients, truth)
                np.testing.assert_array_equal(loop.labels_, est.labels_)
                np.testing.assert_allclose(loop.loss_vectors_, est.loss_vectors_,
                                           rtol=2e-3, atol=1e-4)
        # one model is FedAvg with the same options (exactly: same draws)
        if not isinstance(est, FedAvg) and (cfg["participation"] < 1 or est.n_clusters == 1):
            one = clone(est).set_params(n_clusters=1)
            if isinstance(one, CLoVE):
                one.set_params(max_clusters=1)
            fedavg = FedAvg(**{k: v for k, v in est.get_params().items()
                               if k in FedAvg().get_params()})
            _same_fit(one.fit(clients), fedavg.fit(clients))


# -- regressions -----------------------------------------------------------------------
_TRAIN_BATCHES: list[int] = []


class _RecordingBN(nn.Module):
    """A BatchNorm model recording the size of every training batch it is given."""

    def __init__(self, n_features, n_outputs):
        super().__init__()
        self.a, self.bn, self.b = (nn.Linear(n_features, 4), nn.BatchNorm1d(4),
                                   nn.Linear(4, n_outputs))

    def forward(self, x):
        if self.training and torch.is_grad_enabled():  # (not the fit's no-grad probe)
            _TRAIN_BATCHES.append(x.shape[0])
        return self.b(torch.relu(self.bn(self.a(x))))


def _regression_clients(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [(X, X @ np.array([1.0, -1.0, 0.5])) for X in
            (rng.normal(size=(m, 3)) for m in sizes)]


@pytest.mark.parametrize("Est", [CLoVE, IFCA, FedAvg])
def test_batchnorm_lone_last_sample_joins_the_batch_before_it(Est):
    # a client of 21 samples with batch_size=10 ended each epoch on a batch of one,
    # which BatchNorm refuses in train mode ("Expected more than 1 value per channel")
    kw = {} if Est is FedAvg else {"n_clusters": 2}
    clients = _regression_clients([21, 20, 21, 11])
    _TRAIN_BATCHES.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = Est(model=_RecordingBN, batch_size=10, local_epochs=2, n_rounds=1,
                  random_state=0, **kw).fit(clients)
    assert np.isfinite(est.loss_vectors_).all()
    # per client and epoch: full batches, the lone sample in the last one; every sample
    # is used once an epoch (no batch dropped)
    want = []
    for m in (21, 20, 21, 11):
        want += {21: [10, 11], 20: [10, 10], 11: [11]}[m] * 2
    assert _TRAIN_BATCHES == want


def test_batchnorm_merge_leaves_models_without_batchnorm_alone():
    # the batches of a model without BatchNorm are unchanged (a lone last sample is
    # its own batch): 21 samples, batch_size=10 -> 10, 10, 1
    class Recording(_RecordingBN):
        def __init__(self, n_features, n_outputs):
            super().__init__(n_features, n_outputs)
            self.bn = nn.Identity()

    _TRAIN_BATCHES.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        FedAvg(model=Recording, batch_size=10, n_rounds=1, random_state=0).fit(
            _regression_clients([21]))
    assert _TRAIN_BATCHES == [10, 10, 1]


@pytest.mark.parametrize("Est", [CLoVE, IFCA, FedAvg])
def test_batchnorm_refuses_batches_of_one_up_front(Est):
    kw = {} if Est is FedAvg else {"n_clusters": 2}
    with pytest.raises(ValueError, match=r"batch_size=1 .*BatchNorm"):
        Est(model=bn_net, batch_size=1, n_rounds=1, **kw).fit(
            _regression_clients([10, 10, 10]))
    # two samples a batch are enough (the smallest batch the message asks for)
    Est(model=bn_net, batch_size=2, n_rounds=1, **kw).fit(_regression_clients([10, 10, 10]))
    # a client of one sample cannot train a BatchNorm, whatever the batch size
    for batch_size in (None, 8):
        with pytest.raises(ValueError, match=r"client\(s\) \[1\] .*single sample"):
            Est(model=bn_net, batch_size=batch_size, n_rounds=1, **kw).fit(
                _regression_clients([10, 1, 10]))


def test_flower_node_check_names_the_node():
    engine = Engine(bn_net(3, 1), "mse", vectorize=False, optimizer="adam", lr=0.01,
                    batch_size=8, local_epochs=1, user_model=True)

    def node(m):
        return ClientData.from_lists([torch.ones(m, 3)], [torch.ones(m, 1)], "cpu")

    with pytest.raises(ValueError, match=r"node\(s\) \[0\] .*single sample"):
        engine.check_batches(node(1), name="node")
    engine.check_batches(node(2), name="node")  # two samples train


@pytest.mark.parametrize("vectorize", [True, False])
def test_batchnorm_without_running_statistics_is_refused(vectorize):
    # it normalises by the batch also in eval mode (loss vectors, predictions); the
    # one-sample probe failed with torch's "Expected more than 1 value per channel"
    def net(d, o):
        return nn.Sequential(nn.Linear(d, 4), nn.BatchNorm1d(4, track_running_stats=False),
                             nn.Linear(4, o))

    with pytest.raises(ValueError, match="track_running_stats=True"):
        CLoVE(model=net, vectorize=vectorize, n_rounds=1).fit(_regression_clients([8, 8]))


@pytest.mark.parametrize("Est, first", [(CLoVE, "loss"), (CLoVE, "random"), (IFCA, "random")])
def test_one_model_equals_fedavg_with_partial_participation(Est, first):
    # K = 1 drew a k-means seed each round (and a random round-0 assignment) from the
    # generator that also samples the participants: a different FedAvg run than FedAvg's
    clients = _regression_clients([15, 12, 18, 9, 14, 11], seed=1)
    kw = dict(n_rounds=4, lr=0.05, batch_size=8, participation=0.5, random_state=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        one = Est(n_clusters=1, first_assignment=first, **kw).fit(clients)
        ref = FedAvg(**kw).fit(clients)
    _same_fit(one, ref)


def test_constant_predictor_check_joins_the_targets_once(monkeypatch):
    # it concatenated the targets once per model and once more pooled (K + 1 copies);
    # the reference is still the variance within each model's clients, in float64
    rng = np.random.default_rng(0)
    clients = []
    for g in range(3):
        for _ in range(2):
            X = rng.normal(size=(20, 3))
            clients.append((X, X @ rng.normal(size=3) + 1000.0 * (g + 1)))
    with pytest.warns(ConvergenceWarning):
        est = CLoVE(n_clusters=3, n_rounds=1, random_state=0).fit(clients)
    ys = [c[1] for c in clients]
    sizes = np.full(len(ys), 20.0)
    calls = []
    real = np.concatenate

    def counting(*args, **kwargs):
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(np, "concatenate", counting)
    with pytest.warns(ConvergenceWarning) as rec:
        est._warn_if_worse_than_constant(ys, "mse", sizes)
    monkeypatch.undo()
    assert calls == [len(ys)]  # one join of all the clients' targets
    within = sum(np.concatenate([y for y, lab in zip(ys, est.labels_) if lab == g]).var()
                 * 20 * np.sum(est.labels_ == g) for g in np.unique(est.labels_)) / 120
    assert f"({within:.4g}, the variance of y within" in str(rec[0].message)


@pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
def test_autoencoder_with_a_supervised_loss_is_refused(loss):
    # the decoder's n_features outputs were broadcast against y by the MSE (a silent
    # fit, predictions = the first reconstructed feature), and read as class scores by
    # the cross-entropy (IndexError / torch RuntimeError, or a silent fit with
    # n_features classes)
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(12, 4)) for _ in range(3)]
    y = {"mse": lambda X: X[:, 0], "cross_entropy": lambda X: (X[:, 0] > 0).astype(int)}
    with pytest.raises(ValueError, match=r"model='autoencoder'.*loss='reconstruction'"):
        FedAvg(model="autoencoder", loss=loss, n_rounds=1).fit([(X, y[loss](X)) for X in Xs])
    # its own loss, explicit or "auto", still fits (the targets are not used)
    for kw in ({"loss": "reconstruction"}, {}):
        est = FedAvg(model="autoencoder", n_rounds=1, random_state=0, **kw).fit(Xs)
        assert est.loss_ == "reconstruction" and est.predict(Xs[0]).shape == (12, 4)


class _ItemNet(nn.Module):
    """Control flow on a value (``.item()``): runs in a loop, not under vmap."""

    def __init__(self, n_features, n_outputs):
        super().__init__()
        self.a = nn.Linear(n_features, n_outputs)

    def forward(self, x):
        return self.a(x) if x.sum().item() > -1e30 else -self.a(x)


@pytest.mark.parametrize("first", ["loss", "random"])
def test_vectorize_true_names_itself_when_a_user_model_fails_under_vmap(first):
    # torch's "vmap: It looks like you're calling .item()" RuntimeError reached the
    # user from the loss matrix (or the local training) naming neither option
    clients = _regression_clients([10, 10, 10, 10])
    est = CLoVE(model=_ItemNet, vectorize=True, first_assignment=first, n_rounds=1)
    with pytest.raises(ValueError, match=r"vectorize=True.*\.item\(\).*vectorize=False"):
        est.fit(clients)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert est.set_params(vectorize="auto").fit(clients).labels_.shape == (4,)
