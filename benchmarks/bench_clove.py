"""CLoVE vs IFCA vs FedAvg vs Local-only, and vectorised vs per-client simulation.

Usage::

    python benchmarks/bench_clove.py [--quick] [--out results.json]

Quality cases run every method over several seeds on (a) mixtures of linear
regressions (K in {2, 5}, separation in {1, 0.1}) and (b) scikit-learn digits
split into rotation / label-swap clusters. Reported: final ARI, seeds with
ARI = 1, mean first round (0-based) reaching ARI = 1 (``nan`` if some seed never does),
the matched parameter error (linear) or mean per-client test accuracy (digits),
and the wall time per round. The scaling cases time one CLoVE round for 10 / 100
/ 1000 clients with the vectorised (``vmap``) and the per-client loop engine.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

sys.path.insert(0, os.path.dirname(__file__))
from _harness import Case, benchmark_main, benchmark_parser, env_threads  # noqa: E402

from mlpapers.datasets import make_federated_digits, make_federated_linear  # noqa: E402
from mlpapers.federated import IFCA, CLoVE, FedAvg  # noqa: E402


def _linear_data(K, sep, seed, n_train=400, n_test=100):
    clients, truth, coef = make_federated_linear(n_clusters=K, n_clients_per_cluster=4,
                                                 n_samples=n_train + n_test, separation=sep,
                                                 random_state=seed)
    return ([(X[:n_train], y[:n_train]) for X, y in clients],
            [(X[n_train:], y[n_train:]) for X, y in clients], truth, coef)


def _digits_data(kind, seed):
    clients, truth = make_federated_digits(kind, n_clusters=4, n_clients_per_cluster=5,
                                           n_samples=100, random_state=seed)
    return ([(X[:80], y[:80]) for X, y in clients], [(X[80:], y[80:]) for X, y in clients],
            truth, None)


def _param_error(models, labels, truth, coef):
    W = np.stack([m.weight.detach().numpy()[0] for m in models])
    return float(np.mean([np.linalg.norm(W[labels[i]] - coef[k]) for i, k in enumerate(truth)]))


class LocalOnly(IFCA):
    """Every client trains its own model (one model per client, never averaged)."""

    def _n_models(self, n_clients):
        return n_clients

    def _assign(self, L, round_):
        return np.arange(L.shape[0])


def run(method, data_fn, seeds, params, K):
    aris, first, accs, errs, round_t = [], [], [], [], []
    for seed in seeds:
        train, test, truth, coef = data_fn(seed)
        if method == "Local-only":
            est = LocalOnly(n_clusters=len(train), random_state=seed, **params)
        elif method == "FedAvg":
            est = FedAvg(random_state=seed, **params)
        else:
            est = (CLoVE if method.startswith("CLoVE") else IFCA)(
                n_clusters=K, random_state=seed,
                init="same" if method.endswith("same") else "random", **params)
        est.fit(train, truth)
        if method != "Local-only":
            curve = [h["ari"] for h in est.history_]
            aris.append(adjusted_rand_score(truth, est.labels_))
            first.append(next((t for t, a in enumerate(curve) if a == 1.0), np.nan))
        accs.append(est.score(test))
        if coef is not None:
            errs.append(_param_error(est.models_, est.labels_, truth, coef))
        round_t.append(float(np.mean([h["time_s"] for h in est.history_])))
    out = {}
    if aris:
        out.update(ari=float(np.mean(aris)), seeds_ari1=float(np.sum(np.array(aris) == 1.0)),
                   first_round_ari1=float(np.mean(first)))
    if errs:
        out["param_err"] = float(np.mean(errs))
    else:
        out["test_acc"] = float(np.mean(accs))
    out["round_s"] = float(np.mean(round_t))
    return out


def _scaling_case(n_clients, vectorize):
    K = 5
    clients, _, _ = make_federated_linear(n_clusters=K, n_clients_per_cluster=n_clients // K,
                                          n_samples=100, random_state=0)

    def fn():
        est = CLoVE(n_clusters=K, n_rounds=2, local_epochs=1, batch_size=50, n_init=3,
                    vectorize=vectorize, random_state=0).fit(clients)
        return {"round_s": float(np.mean([h["time_s"] for h in est.history_]))}

    return fn


def make_cases(quick: bool):
    seeds = range(2 if quick else 5)
    methods = ["CLoVE", "CLoVE-same", "IFCA", "IFCA-same", "FedAvg", "Local-only"]
    cases = []
    lin = dict(n_rounds=3 if quick else 5, local_epochs=10, lr=0.02, batch_size=100)
    settings = [(2, 1.0), (5, 1.0)] if quick else [(2, 1.0), (5, 1.0), (2, 0.1), (5, 0.1)]
    for K, sep in settings:
        for m in methods:
            cases.append(Case(
                f"linear K={K} sep={sep}: {m}",
                (lambda m=m, K=K, sep=sep: run(
                    m, lambda s: _linear_data(K, sep, s), seeds, lin, K)),
                warmup=0, repeats=1))
    dig = dict(model="logistic", n_rounds=8 if quick else 15, local_epochs=5, lr=0.05,
               batch_size=40)
    for kind in ("rotation", "label_swap"):
        for m in ("CLoVE", "IFCA", "FedAvg", "Local-only"):
            cases.append(Case(
                f"digits {kind}: {m}",
                (lambda m=m, kind=kind: run(m, lambda s: _digits_data(kind, s), seeds, dig, 4)),
                warmup=0, repeats=1))
    sizes = (10, 100) if quick else (10, 100, 1000)
    for n in sizes:
        for vec in (True, False):
            cases.append(Case(f"round time n={n}: {'vectorised' if vec else 'loop'}",
                              _scaling_case(n, vec), warmup=1, repeats=1))
    return cases


TITLE = "CLoVE vs IFCA vs FedAvg (clustered federated learning)"


def main(argv: list[str] | None = None):
    args = benchmark_parser(TITLE).parse_args(argv)
    # after parsing, so that --help works whatever BENCH_THREADS holds
    torch.set_num_threads(env_threads(1))
    return benchmark_main(make_cases, baseline=None, title=TITLE, args=args)


if __name__ == "__main__":
    main()
