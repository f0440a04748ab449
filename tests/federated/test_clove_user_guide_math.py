"""The math of ``docs/user_guide/clove.rst`` checked against references written from the text.

The page's loop ("The method"): every client evaluates all K models on its training
data (mean loss: the squared error averaged over samples and outputs, or the
cross-entropy averaged over samples), k-means clusters the loss vectors, the Hungarian
algorithm matches clusters to models on the summed losses
:math:`C_{cj} = \\sum_{i \\in c} L_{ij}`, each client trains its matched model for
``local_epochs``, and each model becomes the data-size weighted average of its
clients' updates (a model without clients keeps its weights). The references below
are float64 numpy loops of that text (full-batch SGD, so the mini-batch order plays no
role), run against the public estimators from initial models recorded by a model
factory. Unknown K is checked against a scipy Ward + numpy silhouette reference.
"""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage

from mlpapers.federated import IFCA, CLoVE, FedAvg, choose_n_clusters


class _Recorder:
    """Model factory ``f(n_features, n_outputs)`` that keeps every module it builds.

    The page: ``f`` is called once for the template, once per initial model and once
    per fitted model, so ``built[1:K + 1]`` are the initial models (the estimator
    works on copies and leaves these untouched)."""

    def __init__(self):
        self.built = []

    def __call__(self, n_features, n_outputs):
        m = torch.nn.Linear(n_features, n_outputs)
        self.built.append(m)
        return m


def _params(module):
    return (module.weight.detach().double().numpy().copy(),
            module.bias.detach().double().numpy().copy())


def _mse_and_grad(W, b, X, y):
    # mean over samples and outputs of the squared error; gradient of that mean
    r = X @ W.T + b - y
    loss = float((r**2).mean())
    g = 2.0 * r / r.size
    return loss, g.T @ X, g.sum(0)


def _ce_and_grad(W, b, X, y):
    z = X @ W.T + b
    z = z - z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    n = len(y)
    loss = float(-logp[np.arange(n), y].mean())
    g = np.exp(logp)
    g[np.arange(n), y] -= 1.0
    g /= n
    return loss, g.T @ X, g.sum(0)


def _round_reference(models, clients, assignment, lr, epochs, loss_and_grad):
    """Local full-batch SGD of each client's model, then the data-size weighted average."""
    new = []
    for j, (W, b) in enumerate(models):
        idx = [i for i, a in enumerate(assignment) if a == j]
        if not idx:  # a model without clients keeps its weights
            new.append((W, b))
            continue
        Ws, bs, ns = [], [], []
        for i in idx:
            X, y = clients[i]
            Wi, bi = W.copy(), b.copy()
            for _ in range(epochs):
                _, gW, gb = loss_and_grad(Wi, bi, X, y)
                Wi, bi = Wi - lr * gW, bi - lr * gb
            Ws.append(Wi)
            bs.append(bi)
            ns.append(len(X))
        w = np.asarray(ns, float) / sum(ns)
        new.append((np.einsum("i,i...->...", w, np.array(Ws)),
                    np.einsum("i,i...->...", w, np.array(bs))))
    return new


def _hungarian_brute_force(L, groups, K):
    """Model of each client: the injective group -> model map of least summed loss."""
    G = int(groups.max()) + 1
    C = np.array([L[groups == g].sum(0) for g in range(G)])
    best = min(itertools.permutations(range(K), G),
               key=lambda p: C[np.arange(G), list(p)].sum())
    return np.asarray(best)[groups]


def _linear_clients(seed):
    """Three groups of three clients of unequal sizes. Each client's X is exactly
    whitened (mean 0, X^T X / n = I) and y = X theta_g + c_i, so the mean squared error
    of (w, b) is |w - theta_g|^2 + (b - c_i)^2: the groups' loss vectors are far apart
    (|theta_g| = 1, 3, 6) whatever the initial models, so k-means finds the groups, while
    the client intercepts c_i make the local updates differ (the weights matter)."""
    rng = np.random.default_rng(seed)
    K, d = 3, 4
    truth = np.repeat(np.arange(K), 3)
    coef = rng.normal(size=(K, d))
    coef *= (np.array([1.0, 3.0, 6.0]) / np.linalg.norm(coef, axis=1))[:, None]
    sizes = rng.integers(20, 90, size=len(truth))
    clients = []
    for g, m in zip(truth, sizes):
        G = rng.normal(size=(m, d))
        Q = np.linalg.qr(G - G.mean(0))[0]
        X = (np.sqrt(m) * Q).astype(np.float32)
        y = (X.astype(np.float64) @ coef[g] + rng.uniform(-0.3, 0.3)).astype(np.float32)
        clients.append((X, y[:, None]))
    return clients, truth, K


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_two_rounds_of_clove_follow_the_page_loop(seed, vectorize):
    """User guide, "The method": loss vectors, Hungarian matching on C_cj, local training,
    data-size weighted averaging; and ``loss_vectors_`` of the final models."""
    clients, truth, K = _linear_clients(seed)
    lr, epochs, n_rounds = 0.05, 3, 2
    rec = _Recorder()
    est = CLoVE(n_clusters=K, model=rec, n_rounds=n_rounds, local_epochs=epochs, lr=lr,
                batch_size=1000, optimizer="sgd", vectorize=vectorize,
                random_state=seed).fit(clients)
    assert len(rec.built) == 1 + 2 * K  # "Your own model": template, K initial, K fitted
    models = [_params(m) for m in rec.built[1:K + 1]]
    data = [(X.astype(np.float64), y.astype(np.float64)) for X, y in clients]
    for t in range(n_rounds):
        L = np.array([[_mse_and_grad(W, b, X, y)[0] for W, b in models] for X, y in data])
        # the clients' groups are far apart: k-means finds them; the matching decides
        assignment = _hungarian_brute_force(L, truth, K)
        hist_loss = (L[np.arange(len(data)), assignment] * [len(X) for X, _ in data]).sum()
        assert est.history_[t]["loss"] == pytest.approx(
            hist_loss / sum(len(X) for X, _ in data), rel=1e-4)
        models = _round_reference(models, data, assignment, lr, epochs, _mse_and_grad)
    np.testing.assert_array_equal(est.labels_, assignment)
    for (W, b), m in zip(models, est.models_):
        np.testing.assert_allclose(m.weight.detach().double().numpy(), W, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(m.bias.detach().double().numpy(), b, rtol=1e-4, atol=1e-5)
    L = np.array([[_mse_and_grad(W, b, X, y)[0] for W, b in models] for X, y in data])
    np.testing.assert_allclose(est.loss_vectors_, L, rtol=1e-4, atol=1e-6)


def test_ifca_round_is_the_argmin_loop():
    """User guide, "The method": IFCA runs the same loop with a_i = argmin_j l_i(theta_j)."""
    clients, _, K = _linear_clients(3)
    rec = _Recorder()
    est = IFCA(n_clusters=K, model=rec, n_rounds=1, local_epochs=2, lr=0.05, batch_size=1000,
               optimizer="sgd", random_state=3).fit(clients)
    models = [_params(m) for m in rec.built[1:K + 1]]
    data = [(X.astype(np.float64), y.astype(np.float64)) for X, y in clients]
    L = np.array([[_mse_and_grad(W, b, X, y)[0] for W, b in models] for X, y in data])
    assignment = L.argmin(1)
    models = _round_reference(models, data, assignment, 0.05, 2, _mse_and_grad)
    np.testing.assert_array_equal(est.labels_, assignment)
    for (W, b), m in zip(models, est.models_):  # includes untouched models, if any
        np.testing.assert_allclose(m.weight.detach().double().numpy(), W, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(m.bias.detach().double().numpy(), b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cls", [FedAvg, CLoVE])
def test_cross_entropy_rounds_with_one_model_are_weighted_fedavg(cls):
    """User guide, "The method" step 4 with cross-entropy losses; one model (K = 1) is
    FedAvg (research note, section 4): weights proportional to the clients' sizes."""
    rng = np.random.default_rng(5)
    d, C = 3, 3
    clients = []
    for m in (17, 40, 73):
        X = rng.normal(size=(m, d)).astype(np.float32)
        clients.append((X, rng.integers(0, C, size=m)))
    rec = _Recorder()
    kw = {"n_clusters": 1} if cls is CLoVE else {}
    est = cls(model=rec, n_rounds=3, local_epochs=2, lr=0.3, batch_size=1000, optimizer="sgd",
              random_state=0, **kw).fit(clients)
    models = [_params(rec.built[1])]
    data = [(X.astype(np.float64), y) for X, y in clients]
    for _ in range(3):
        models = _round_reference(models, data, [0, 0, 0], 0.3, 2, _ce_and_grad)
    W, b = models[0]
    m = est.models_[0]
    np.testing.assert_allclose(m.weight.detach().double().numpy(), W, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m.bias.detach().double().numpy(), b, rtol=1e-4, atol=1e-5)
    L = np.array([[_ce_and_grad(W, b, X, y)[0]] for X, y in data])
    np.testing.assert_allclose(est.loss_vectors_, L, rtol=1e-4, atol=1e-6)


def test_unsupervised_loss_is_the_mean_reconstruction_error():
    """User guide, "Usage": clients given as ``X`` alone use the autoencoder
    reconstruction loss, the squared error of X averaged over samples and features."""
    rng = np.random.default_rng(7)
    d = 3
    clients = [rng.normal(size=(m, d)).astype(np.float32) for m in (11, 29, 50)]
    rec = _Recorder()
    est = FedAvg(model=rec, n_rounds=2, local_epochs=3, lr=0.1, batch_size=1000,
                 optimizer="sgd", random_state=0).fit(clients)
    data = [(X.astype(np.float64), X.astype(np.float64)) for X in clients]
    models = _round_reference([_params(rec.built[1])], data, [0, 0, 0], 0.1, 3, _mse_and_grad)
    models = _round_reference(models, data, [0, 0, 0], 0.1, 3, _mse_and_grad)
    W, b = models[0]
    np.testing.assert_allclose(est.models_[0].weight.detach().double().numpy(), W, rtol=1e-4,
                               atol=1e-5)
    L = np.array([[_mse_and_grad(W, b, X, y)[0]] for X, y in data])
    np.testing.assert_allclose(est.loss_vectors_, L, rtol=1e-4, atol=1e-6)


def _silhouette(X, labels):
    D = np.sqrt(((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    s = np.zeros(len(X))
    for i in range(len(X)):
        own = labels == labels[i]
        if own.sum() == 1:
            continue  # a singleton scores 0
        a = D[i, own].sum() / (own.sum() - 1)
        b = min(D[i, labels == c].mean() for c in np.unique(labels) if c != labels[i])
        s[i] = (b - a) / max(a, b)
    return s.mean()


@pytest.mark.parametrize("seed", range(6))
def test_unknown_k_is_ward_plus_silhouette_with_the_ten_percent_rule(seed):
    """User guide, "Choices where the paper is silent", bullet "Unknown K": k in
    [2, min(max_clusters, n_distinct, n - 1)] by Ward linkage + silhouette, a larger k
    having to improve the silhouette by more than 10 %."""
    rng = np.random.default_rng(seed)
    n_groups = int(rng.integers(2, 6))
    centres = rng.uniform(0.0, 4.0, size=(n_groups, 4))
    L = np.repeat(centres, int(rng.integers(2, 5)), axis=0)
    L = np.abs(L + rng.normal(scale=float(rng.uniform(0.05, 1.0)), size=L.shape))
    max_clusters = int(rng.integers(3, 9))
    hi = min(max_clusters, len(np.unique(L, axis=0)), len(L) - 1)
    Z = linkage(L, method="ward")
    best_k, best = None, None
    for k in range(2, hi + 1):
        s = _silhouette(L, fcluster(Z, k, criterion="maxclust"))
        if best_k is None or s > best + 0.1 * abs(best):
            best_k, best = k, s
    assert choose_n_clusters(L, max_clusters) == best_k


def test_defaults_match_the_page():
    """User guide, "Choices where the paper is silent", bullet "Defaults", and "Usage"."""
    sig = {k: p.default for k, p in inspect.signature(CLoVE).parameters.items()}
    assert sig["optimizer"] == "adam" and sig["batch_size"] == 100
    assert sig["local_epochs"] == 1 and sig["first_assignment"] == "loss"
    assert sig["init"] == "random" and sig["lr"] == 1e-2 and sig["n_rounds"] == 20
    assert sig["n_init"] == 10 and sig["freeze_after"] is None
    assert sig["loss_transform"] is None and sig["participation"] == 1.0
    assert sig["max_clusters"] == 15  # the research note's upper bound
    for cls in (IFCA, FedAvg):
        other = {k: p.default for k, p in inspect.signature(cls).parameters.items()}
        for k in ("optimizer", "batch_size", "local_epochs", "lr", "n_rounds"):
            assert other[k] == sig[k]
