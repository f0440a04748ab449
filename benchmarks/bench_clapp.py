"""Benchmark: local CLAPP / CLAPP++ variants vs end-to-end BP-SSL on shifted digits.

Every arm uses the same encoder (``architecture``), augmentations, epochs and seeds.
Metrics: linear-probe accuracy (logistic regression on standardised features of all
blocks and of the last block, mean over seeds), the mean per-block cosine between
the local and the backprop update (local arms, lower blocks only), training time
per epoch, and the harness' peak memory and wall time (fit + probe, all seeds).

Run ``python benchmarks/bench_clapp.py`` (or ``--quick`` for a smoke run).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import Case, benchmark_main  # noqa: E402

from mlpapers.datasets import make_shifted_digits  # noqa: E402
from mlpapers.ssl import CLAPPEncoder, GlobalSSLEncoder, update_similarity  # noqa: E402


def _probe(enc, Xtr, ytr, Xte, yte, layers="all") -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500, C=0.1))
    clf.fit(enc.transform(Xtr, layers=layers), ytr)
    return float(clf.score(enc.transform(Xte, layers=layers), yte))


def make_cases(quick: bool):
    n_train, n_test = (300, 200) if quick else (800, 400)
    epochs = 3 if quick else 20
    seeds = [0] if quick else [0, 1, 2]
    X, y = make_shifted_digits(n_samples=n_train + n_test, random_state=0)
    Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
    common = dict(architecture="tiny", augment="light")

    def arm(factory, epochs, similarity=False):
        def run():
            acc_all, acc_last, sims, per_epoch = [], [], [], []
            for seed in seeds:
                enc = factory(n_epochs=epochs, random_state=seed, **common)
                start = time.perf_counter()
                enc.fit(Xtr)
                per_epoch.append((time.perf_counter() - start) / max(epochs, 1))
                acc_all.append(_probe(enc, Xtr, ytr, Xte, yte))
                acc_last.append(_probe(enc, Xtr, ytr, Xte, yte, layers=-1))
                if similarity:
                    sim = update_similarity(enc, Xtr, n_batches=5, random_state=seed)
                    sims.append(np.mean([v for k, v in sim.items() if k < len(sim) - 1]))
            out = {"acc_all": np.mean(acc_all), "acc_all_std": np.std(acc_all),
                   "acc_last": np.mean(acc_last), "epoch_s": np.mean(per_epoch)}
            if similarity:
                out["cos_local_bp"] = np.mean(sims)
            return out
        return run

    def local(variant):
        return lambda **kw: CLAPPEncoder(variant=variant, **kw)

    def glob(loss):
        return lambda **kw: GlobalSSLEncoder(loss=loss, **kw)

    once = dict(warmup=0, repeats=1)
    return [
        Case("random init", arm(local("clapp++dfb"), 0), **once, note="untrained encoder"),
        Case("CLAPP", arm(local("clapp"), epochs, True), **once, note="lateral, global pool"),
        Case("CLAPP++", arm(local("clapp++"), epochs, True), **once, note="lateral, 2x2 grid"),
        Case("CLAPP++DFB", arm(local("clapp++dfb"), epochs, True), **once,
             note="direct feedback from the top"),
        Case("CLAPP++both", arm(local("clapp++both"), epochs, True), **once,
             note="top + lateral context"),
        Case("BP-CLAPP", arm(glob("clapp"), epochs), **once, note="end-to-end, hinge at top"),
        Case("BP-InfoNCE", arm(glob("infonce"), epochs), **once, note="end-to-end SimCLR"),
    ]


if __name__ == "__main__":
    benchmark_main(make_cases, baseline="random init",
                   title="CLAPP: local vs global self-supervised learning (shifted digits)")
