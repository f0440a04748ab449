"""CLI demo: ``python -m mlpapers demo amips [--quick]``."""

from __future__ import annotations

import time

import numpy as np

from mlpapers._registry import DemoResult, register


@register(
    "amips",
    module="mlpapers.retrieval.amips",
    estimator="AmortizedMIPS",
    paper="Amortizing Maximum Inner Product Search with Learned Support Functions",
    arxiv="2603.08001",
)
def demo(quick: bool) -> list[DemoResult]:
    """Train KeyNet and SupportNet on a synthetic MIPS problem; compare their match rate
    with the best query-independent guess (the key that wins for the mean query)."""
    from mlpapers.datasets import make_mips_problem
    from mlpapers.retrieval.amips import AmortizedMIPS, ExactMIPS, match_rate, recall_at_k

    n_keys, d, steps, width = (400, 8, 200, 64) if quick else (1000, 16, 500, 96)
    keys, Q, sampler = make_mips_problem(n_keys, d, n_queries=2000, random_state=0)
    start = time.perf_counter()
    exact = ExactMIPS().fit(keys)
    truth = exact.predict(Q)
    t_exact = time.perf_counter() - start
    # query-independent baseline: the key that is best for the average query
    guess = int(exact.predict(Q.mean(0, keepdims=True))[0])
    base = match_rate(truth, np.full(len(Q), guess))
    base_r10 = float(np.isin(truth, exact.kneighbors(Q.mean(0, keepdims=True), 10)[1]).mean())
    out = []
    for arch in ("keynet", "supportnet"):
        start = time.perf_counter()
        model = AmortizedMIPS(arch=arch, depth=3, hidden_dim=width, n_steps=steps,
                              batch_size=512, lr=1e-2, random_state=0)
        model.fit(keys, queries=sampler)
        idx = model.kneighbors(Q, 10, return_distance=False)
        elapsed = time.perf_counter() - start
        out.append(DemoResult(f"AmortizedMIPS ({arch})", "mean-query key", "match@1",
                              match_rate(truth, idx), base, elapsed, t_exact))
        out.append(DemoResult(f"AmortizedMIPS ({arch})", "mean-query key", "recall@10",
                              recall_at_k(truth, idx, 10), base_r10, elapsed, t_exact))
    return out
