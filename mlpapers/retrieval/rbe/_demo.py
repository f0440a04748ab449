"""CLI demo: ``python -m mlpapers demo rbe [--quick]``."""

from __future__ import annotations

import time

import numpy as np

from mlpapers._registry import DemoResult, register


def _run(est, Q_tr, Q_te, items, R_tr, R_te, k):
    start = time.perf_counter()
    est.fit(Q_tr, items, relevance_matrix=R_tr)
    score = est.score(Q_te, R_te, n_neighbors=k)
    return score, time.perf_counter() - start


@register("rbe", module="mlpapers.retrieval.rbe", estimator="RelevanceBasedRetriever",
          paper="Relevance-Based Embeddings: Lightweight Candidate Retrieval via "
                "Heavy-Ranker Calls", arxiv="PMLR v306 (no arXiv)")
def demo(quick: bool) -> list[DemoResult]:
    """Greedy/k-means support items vs AnnCUR's random ones, HitRate@10 at equal budget.

    A synthetic nonlinear heavy ranker; both methods make the same number of
    online heavy calls per query (``n_support``); AnnCUR's score is averaged over
    3 random anchor sets.
    """
    from mlpapers.datasets import make_relevance_problem
    from mlpapers.retrieval.rbe import AnnCURRetriever, RelevanceBasedRetriever

    n_tr, n_te, n_items, k_sup = (500, 200, 600, 10) if quick else (1500, 500, 2000, 20)
    Q, items, heavy = make_relevance_problem(n_tr + n_te, n_items, random_state=0)
    R = heavy(Q, items)
    data = (Q[:n_tr], Q[n_tr:], items, R[:n_tr], R[n_tr:], 10)
    cur = [_run(AnnCURRetriever(heavy, n_support=k_sup, random_state=s), *data)
           for s in range(3)]
    c_score, c_time = float(np.mean([c[0] for c in cur])), float(np.mean([c[1] for c in cur]))
    out = []
    for support in ("greedy", "kmeans"):
        est = RelevanceBasedRetriever(heavy, n_support=k_sup, support=support, random_state=0)
        s, t = _run(est, *data)
        out.append(DemoResult(f"RBE ({support}, {k_sup} calls)", f"AnnCUR ({k_sup} calls)",
                              "HitRate@10", s, c_score, t, c_time))
    return out
