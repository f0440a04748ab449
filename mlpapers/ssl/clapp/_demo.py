"""CLI demo: CLAPP++DFB (local) vs a random-init encoder and BP-CLAPP (global backprop)."""

from __future__ import annotations

import time
from typing import Any

from mlpapers._registry import DemoResult, register


def _probe_accuracy(enc, Xtr, ytr, Xte, yte, layers="all") -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500, C=0.1))
    clf.fit(enc.transform(Xtr, layers=layers), ytr)
    return float(clf.score(enc.transform(Xte, layers=layers), yte))


@register(
    "clapp",
    module="mlpapers.ssl.clapp",
    estimator="CLAPPEncoder",
    paper="Can Local Learning Match Self-Supervised Backpropagation?",
    arxiv="2601.21683",
)
def demo(quick: bool) -> list[DemoResult]:
    """Linear-probe accuracy on shifted digits: local CLAPP++DFB vs random init and BP."""
    from mlpapers.datasets import make_shifted_digits
    from mlpapers.ssl.clapp import CLAPPEncoder, GlobalSSLEncoder

    n_train, n_test, epochs = (600, 300, 6) if quick else (800, 400, 15)
    X, y = make_shifted_digits(n_samples=n_train + n_test, random_state=0)
    Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
    # batch 16: on 800 images, 32 gives too few local updates per epoch (see the benchmark)
    kw: dict[str, Any] = dict(architecture="tiny", augment="light", batch_size=16,
                              random_state=0)

    def fit(enc):
        start = time.perf_counter()
        enc.fit(Xtr)
        return enc, time.perf_counter() - start

    dfb, t_dfb = fit(CLAPPEncoder(variant="clapp++dfb", n_epochs=epochs, **kw))
    rand, t_rand = fit(CLAPPEncoder(n_epochs=0, **kw))
    out = []
    for layers, tag in [("all", "all layers"), (-1, "last layer")]:
        out.append(DemoResult(
            "CLAPP++DFB", "random-init encoder", f"probe accuracy ({tag})",
            _probe_accuracy(dfb, Xtr, ytr, Xte, yte, layers),
            _probe_accuracy(rand, Xtr, ytr, Xte, yte, layers), t_dfb, t_rand))
    if not quick:
        bp, t_bp = fit(GlobalSSLEncoder(loss="clapp", n_epochs=epochs, **kw))
        out.append(DemoResult(
            "CLAPP++DFB", "BP-CLAPP (end-to-end)", "probe accuracy (all layers)",
            out[0].value, _probe_accuracy(bp, Xtr, ytr, Xte, yte), t_dfb, t_bp))
    return out
