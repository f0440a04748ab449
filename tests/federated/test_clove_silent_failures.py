"""Fits that end far above a constant predictor warn (session 17, data made elsewhere).

With the default ``model="linear"``, targets offset by 1000 or raw features with flipped
labels ended at a training loss many times that of predicting a constant, finite and
without a word. Each test also checks that the same federation, standardised, is quiet.
"""

import math
import re
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import StandardScaler

from mlpapers.federated import IFCA, CLoVE, FedAvg


def _quiet(fit):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        return fit()


def _final_loss(est, clients):
    """The data-weighted mean loss of each client's own model after the last round."""
    sizes = np.array([len(c[1]) for c in clients], dtype=float)
    chosen = est.loss_vectors_[np.arange(len(est.labels_)), est.labels_]
    return float((chosen * sizes).sum() / sizes.sum())


def _offset_regression(offset, seed=0):
    # 3 groups x 4 clients, y = X w_g + offset (+ small noise), 40 rows a client
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(3, 5))
    clients = []
    for g in range(3):
        for _ in range(4):
            X = rng.normal(size=(40, 5))
            clients.append((X, X @ W[g] + offset + 0.1 * rng.normal(size=40)))
    return clients


@pytest.mark.parametrize("Est", [CLoVE, IFCA, FedAvg])
def test_regression_with_offset_targets_warns(Est):
    kw = {} if Est is FedAvg else {"n_clusters": 3}
    clients = _offset_regression(1000.0)
    with pytest.warns(ConvergenceWarning, match="constant predictor.*Standardise X") as rec:
        est = Est(n_rounds=5, random_state=0, **kw).fit(clients)
    assert rec[0].filename == __file__  # points at the user's call
    y = np.concatenate([c[1] for c in clients])
    assert _final_loss(est, clients) > 1e3 * y.var()   # ~1e6 against ~4: far from a near miss
    # the same targets centred and scaled (a fit of 40 rounds learns them)
    mu, sd = y.mean(), y.std()
    scaled = [(X, (t - mu) / sd) for X, t in clients]
    good = _quiet(lambda: Est(n_rounds=40, lr=0.05, random_state=0, **kw).fit(scaled))
    assert _final_loss(good, scaled) < 1.0   # the constant's loss is 1 on standardised y


def test_raw_features_with_flipped_labels_warn():
    # raw breast cancer (features up to ~4000), half of the clients with flipped labels:
    # the training loss ended near 5 to 10 against log 2 for a constant
    X, y = load_breast_cancer(return_X_y=True)
    idx = np.array_split(np.random.default_rng(0).permutation(len(y)), 6)
    raw = [(X[i], 1 - y[i] if k % 2 else y[i]) for k, i in enumerate(idx)]
    with pytest.warns(ConvergenceWarning, match=r"log C"):
        est = CLoVE(n_clusters=2, model="logistic", n_rounds=5, random_state=0).fit(raw)
    assert _final_loss(est, raw) > 2 * math.log(2)
    Xs = StandardScaler().fit_transform(X)
    scaled = [(Xs[i], t) for i, (_, t) in zip(idx, raw)]
    good = _quiet(lambda: CLoVE(n_clusters=2, model="logistic", n_rounds=5,
                                random_state=0).fit(scaled))
    assert _final_loss(good, scaled) < math.log(2)


@pytest.mark.parametrize("Est", [CLoVE, IFCA])
def test_offsets_per_cluster_are_judged_within_each_models_clients(Est):
    """Targets offset by +1000, -1000 and 0 per cluster: the clusters were recovered
    but each model ended near its clients' offset-free loss of ~6.7e5, and the pooled
    variance of y (which counts the spread between the offsets, ~6.7e5) let it pass. Each
    model's bias can reach its own clients' mean, so the reference is the variance
    within the clients of each model (~3.8 here)."""
    rng = np.random.default_rng(0)
    W = rng.normal(size=(3, 5))
    clients = []
    for g, off in enumerate([1000.0, -1000.0, 0.0]):
        for _ in range(4):
            X = rng.normal(size=(40, 5))
            clients.append((X, X @ W[g] + off + 0.1 * rng.normal(size=40)))
    y = np.concatenate([c[1] for c in clients])
    with pytest.warns(ConvergenceWarning, match="within each model's clients"):
        est = Est(n_clusters=3, n_rounds=5, random_state=0).fit(clients)
    assert _final_loss(est, clients) < 2 * y.var()  # what the pooled reference missed


def test_targets_constant_within_each_model_fall_back_to_the_pooled_variance():
    """Targets +1 / -1 per cluster (plus a 1e-9 ramp): the variance within each model's
    clients is ~1e-19, so any rounding-level loss was "more than twice" it and a good fit
    warned; below 1e-12 of the mean square the pooled variance is the reference."""
    rng = np.random.default_rng(0)
    clients = []
    for g in range(2):
        for _ in range(3):
            X = rng.normal(size=(30, 4))
            clients.append((X, (1.0 if g else -1.0) + 1e-9 * np.arange(30)))
    est = _quiet(lambda: CLoVE(n_clusters=2, n_rounds=20, random_state=0).fit(clients))
    y = np.concatenate([c[1] for c in clients])
    assert 1e-6 < _final_loss(est, clients) < y.var()


def test_multi_output_reference_is_the_constant_predictors_mean_squared_error():
    """The losses of a multi-output regression are means over the outputs (MSE per
    entry), so the constant predictor's reference is the mean of the outputs' variances
    (what the best constant leaves per entry), not their sum (twice it for two outputs);
    outputs of very different scales also tell the mean from either output's own
    variance."""
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(4):
        X = rng.normal(size=(40, 3))
        Y = np.column_stack([X @ [1.0, 2.0, 0.5] + 1000.0, 0.1 * X[:, 0] + 1000.0])
        clients.append((X, Y))
    with pytest.warns(ConvergenceWarning, match="constant predictor") as rec:
        FedAvg(n_rounds=2, random_state=0).fit(clients)
    message = str(next(w.message for w in rec if "constant predictor" in str(w.message)))
    found = re.search(r"constant predictor \(([^,]+),", message)
    assert found, message
    Y = np.concatenate([c[1] for c in clients])
    assert float(found.group(1)) == pytest.approx(Y.var(axis=0).mean(), rel=1e-3)


@pytest.mark.parametrize("Est", [CLoVE, FedAvg])
def test_a_fit_on_unstandardised_targets_that_learns_is_quiet(Est):
    """Targets of variance ~60 with unit noise: the fit ends near 1.5, far below
    twice the constant predictor's loss and says nothing (the reference scales with the
    targets: the rule is relative, not absolute)."""
    rng = np.random.default_rng(0)
    w = 10 * rng.normal(size=5)
    clients = []
    for _ in range(4):
        X = rng.normal(size=(40, 5))
        clients.append((X, X @ w + rng.normal(size=40)))
    kw = {} if Est is FedAvg else {"n_clusters": 2}
    est = _quiet(lambda: Est(n_rounds=60, lr=0.5, random_state=0, **kw).fit(clients))
    y = np.concatenate([c[1] for c in clients])
    assert 0.2 < _final_loss(est, clients) < 0.1 * y.var()


def test_missing_targets_in_an_object_y_are_refused():
    # a list or pandas column holding None passed (object dtype) and was read as NaN:
    # assign took the argmin of NaN losses (model 0, silently) and fit blamed the lr
    from mlpapers.datasets import make_federated_linear

    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=3,
                                          n_samples=40, random_state=1)
    est = CLoVE(n_clusters=2, n_rounds=3, local_epochs=5, lr=0.05, random_state=0).fit(clients)
    X, y = clients[int(np.flatnonzero(est.labels_ == 1)[0])]
    assert est.assign(X, y) == 1
    for missing in (None, float("nan"), np.inf):
        y_obj = list(y[:-1]) + [missing]
        with pytest.raises(ValueError, match="contains NaN or infinity"):
            est.assign(X, y_obj)
        with pytest.raises(ValueError, match="contains NaN or infinity"):
            CLoVE(n_clusters=2, n_rounds=1).fit([(X, y_obj)] + clients[1:])
    with pytest.raises(TypeError, match="complex"):
        est.assign(X, y * (1 + 1j))
    # finite targets held as objects stay accepted
    assert est.assign(X, np.asarray(y, dtype=object)) == 1
