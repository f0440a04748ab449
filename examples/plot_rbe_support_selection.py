"""
=====================================================
Relevance-based embeddings: choosing support items
=====================================================

A heavy ranker (here a synthetic nonlinear scorer) is too expensive to run on
every item for every query. Relevance-based embeddings (RBE) describe a query by
its heavy scores on ``k`` *support items* and predict the scores of all other
items from embeddings learned offline. With random supports this is AnnCUR; RBE
chooses them, e.g. greedily to minimise the reconstruction error of the training
relevance matrix. The plot shows HitRate@10 (overlap with the heavy ranker's true
top 10) against the number of online heavy calls per query, with the adaptive
ADACUR baseline, which chooses its anchors per query over several rounds, for
comparison.
"""

import matplotlib.pyplot as plt
import numpy as np

from mlpapers.datasets import make_relevance_problem
from mlpapers.retrieval.rbe import AdaCURRetriever, AnnCURRetriever, RelevanceBasedRetriever

Q, items, heavy = make_relevance_problem(700, 600, random_state=0)
R = heavy(Q, items)  # offline: training queries x all items (test part = ground truth)
Q_tr, Q_te, R_tr, R_te = Q[:500], Q[500:], R[:500], R[500:]

budgets = [5, 10, 20, 40]
curves = {}
for support in ("greedy", "kmeans", "farthest", "popular"):
    curves[f"RBE ({support})"] = [
        RelevanceBasedRetriever(heavy, n_support=k, support=support, random_state=0)
        .fit(Q_tr, items, relevance_matrix=R_tr).score(Q_te, R_te, n_neighbors=10)
        for k in budgets
    ]
# ADACUR spends the same budget adaptively: 4 rounds, each scoring the top
# unscored items under the CUR approximation fitted to the query's scores so far.
curves["ADACUR (4 rounds)"] = [
    AdaCURRetriever(heavy, n_calls=k, n_rounds=4, random_state=0)
    .fit(Q_tr, items, relevance_matrix=R_tr).score(Q_te, R_te, n_neighbors=10)
    for k in budgets
]
curves["AnnCUR (random, 5 seeds)"] = [
    np.mean([AnnCURRetriever(heavy, n_support=k, random_state=s)
             .fit(Q_tr, items, relevance_matrix=R_tr).score(Q_te, R_te, n_neighbors=10)
             for s in range(5)])
    for k in budgets
]

fig, ax = plt.subplots(figsize=(6, 4))
for name, values in curves.items():
    ax.plot(budgets, values, marker="o", ls="--" if "CUR" in name else "-", label=name)
ax.set_xlabel("heavy-ranker calls per query (support items)")
ax.set_ylabel("HitRate@10")
ax.set_xscale("log")
ax.minorticks_off()
ax.set_xticks(budgets, [str(b) for b in budgets])
ax.legend()
ax.set_title("Support selection at equal online budget")
fig.tight_layout()
plt.show()
