"""CLI demo: ``python -m mlpapers demo clove [--quick]``."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from sklearn.metrics import adjusted_rand_score

from mlpapers._registry import DemoResult, register


def _timed(est, clients, truth):
    start = time.perf_counter()
    est.fit(clients, truth)
    return est, time.perf_counter() - start


def _param_error(est, truth, coef) -> float:
    W = np.stack([m.weight.detach().cpu().numpy()[0] for m in est.models_])
    return float(max(np.linalg.norm(W[est.labels_[i]] - coef[k]) for i, k in enumerate(truth)))


@register(
    "clove",
    module="mlpapers.federated.clove",
    estimator="CLoVE",
    paper="CLoVE: Personalized Federated Learning through Clustering of Loss Vector Embeddings",
    arxiv="2506.22427",
)
def demo(quick: bool) -> list[DemoResult]:
    """CLoVE vs IFCA and FedAvg on a linear mixture and on label-swapped digits."""
    from mlpapers.datasets import make_federated_digits, make_federated_linear
    from mlpapers.federated.clove import IFCA, CLoVE, FedAvg

    seeds = range(1 if quick else 3)
    rows: dict[str, list] = {}

    def add(key, value, t):
        rows.setdefault(key, []).append((value, t))

    K = 4 if quick else 5
    lin: dict[str, Any] = dict(n_clusters=K, n_rounds=3 if quick else 5, local_epochs=10,
                               lr=0.02, batch_size=100, init="same")
    for seed in seeds:
        clients, truth, coef = make_federated_linear(n_clusters=K, n_clients_per_cluster=4,
                                                     n_samples=500, random_state=seed)
        for name, est in (("CLoVE", CLoVE(random_state=seed, **lin)),
                          ("IFCA", IFCA(random_state=seed, **lin))):
            est, t = _timed(est, clients, truth)
            add(f"lin_ari_{name}", adjusted_rand_score(truth, est.labels_), t)
            add(f"lin_err_{name}", _param_error(est, truth, coef), t)
        fed = FedAvg(random_state=seed, **{k: v for k, v in lin.items()
                                           if k not in ("n_clusters", "init")})
        fed, t = _timed(fed, clients, None)
        add("lin_err_FedAvg", _param_error(fed, truth, coef), t)

        dclients, dtruth = make_federated_digits("label_swap", n_clusters=4, n_samples=100,
                                                 random_state=seed)
        train = [(X[:80], y[:80]) for X, y in dclients]
        test = [(X[80:], y[80:]) for X, y in dclients]
        dig: dict[str, Any] = dict(model="logistic", n_rounds=8 if quick else 15,
                                   local_epochs=5, lr=0.05, batch_size=40, random_state=seed)
        for name, est in (("CLoVE", CLoVE(n_clusters=4, **dig)),
                          ("IFCA", IFCA(n_clusters=4, **dig)), ("FedAvg", FedAvg(**dig))):
            est, t = _timed(est, train, dtruth)
            add(f"dig_acc_{name}", est.score(test), t)

    def mean(key):
        vals = np.array(rows[key])
        return float(vals[:, 0].mean()), float(vals[:, 1].mean())

    def row(metric, a, b, higher=True):
        (va, ta), (vb, tb) = mean(a), mean(b)
        return DemoResult(a.rsplit("_", 1)[1], b.rsplit("_", 1)[1], metric, va, vb, ta, tb,
                          higher_is_better=higher)

    return [
        row("ARI, linear mixture, identical init", "lin_ari_CLoVE", "lin_ari_IFCA"),
        row("max param error, linear mixture", "lin_err_CLoVE", "lin_err_IFCA", False),
        row("max param error, linear mixture", "lin_err_CLoVE", "lin_err_FedAvg", False),
        row("test accuracy, digits label swap", "dig_acc_CLoVE", "dig_acc_IFCA"),
        row("test accuracy, digits label swap", "dig_acc_CLoVE", "dig_acc_FedAvg"),
    ]
