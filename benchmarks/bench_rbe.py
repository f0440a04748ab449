"""Relevance-based embeddings: HitRate@K against the online heavy-call budget.

The paper's protocol: every method gets ``B`` heavy-ranker calls per test query.
CUR-type methods (AnnCUR, RBE with each support strategy, neural RBE) spend them
on ``B`` support items and rank all items by the approximate score (no
re-ranking); the distilled two-tower dual encoder (MLP towers on the query/item
features, trained by MSE on the same training relevance matrix) re-ranks its top
``B`` with the heavy model and fills the remaining positions in its own order.
HitRate@K is the overlap of the top ``K`` with the heavy ranker's exact top ``K``
(brute force, ``n_items`` calls, is the reference).

Data: :func:`mlpapers.datasets.make_relevance_problem` (low-rank part plus a
non-separable tanh interaction, ``nonlinearity=2``), relevance of the training
queries to all items precomputed once (the offline cost shared by all methods).

Run: ``python benchmarks/bench_rbe.py [--quick] --repeats 1 --warmup 0``.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from _harness import Case, benchmark_main

from mlpapers.datasets import make_relevance_problem
from mlpapers.retrieval.rbe import AnnCURRetriever, RelevanceBasedRetriever, hit_rate


def _two_tower(Q_tr, items, R_tr, *, steps, seed=0, width=128, dim=64):
    """A dual encoder distilled from the heavy scores (MSE), returns a scoring function."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d = Q_tr.shape[1]

    def tower():
        return torch.nn.Sequential(torch.nn.Linear(d, width), torch.nn.ELU(),
                                   torch.nn.Linear(width, width), torch.nn.ELU(),
                                   torch.nn.Linear(width, dim))

    fq, fi = tower(), tower()
    bias = torch.nn.Parameter(torch.zeros(len(items)))
    Xq = torch.as_tensor(Q_tr, dtype=torch.float32)
    Xi = torch.as_tensor(items, dtype=torch.float32)
    T = torch.as_tensor(R_tr, dtype=torch.float32)
    mu, sd = T.mean(), T.std()
    T = (T - mu) / sd
    opt = torch.optim.Adam([*fq.parameters(), *fi.parameters(), bias], lr=1e-3)
    for _ in range(steps):
        qi = torch.randint(len(Xq), (256,), generator=g)
        ii = torch.randint(len(Xi), (256,), generator=g)
        pred = fq(Xq[qi]) @ fi(Xi[ii]).T + bias[ii]
        loss = torch.mean((pred - T[qi][:, ii]) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        E = fi(Xi)

    def score(Q):
        with torch.no_grad():
            return (fq(torch.as_tensor(Q, dtype=torch.float32)) @ E.T + bias).numpy()

    return score


def make_cases(quick: bool):
    if quick:
        n_tr, n_te, n_items, budgets, mlp_iter, tt_steps, K = 400, 100, 800, (20, 50), 300, 300, 20
        kw = dict(n_hidden=64, nonlinearity=2.0)
    else:
        n_tr, n_te, n_items, budgets, mlp_iter, tt_steps, K = 1000, 300, 2000, \
            (50, 100, 200, 500), 500, 1000, 100
        kw = dict(n_hidden=128, nonlinearity=2.0)
    Q, items, heavy = make_relevance_problem(n_tr + n_te, n_items, random_state=0, **kw)
    R = heavy(Q, items)
    Q_tr, Q_te, R_tr, R_te = Q[:n_tr], Q[n_tr:], R[:n_tr], R[n_tr:]
    metric = f"hit@{K}"

    def brute():
        idx = np.argsort(-heavy(Q_te, items), axis=1, kind="stable")[:, :K]
        return {"B": n_items, metric: hit_rate(R_te, idx)}

    def cur_case(make, B):
        def run():
            est = make(B).fit(Q_tr, items, relevance_matrix=R_tr)
            return {"B": B, metric: est.score(Q_te, R_te, n_neighbors=K)}
        return run

    def dual(B):
        def run():
            score = _two_tower(Q_tr, items, R_tr, steps=tt_steps)
            cand = np.argsort(-score(Q_te), axis=1, kind="stable")[:, :max(B, K)]
            true = np.take_along_axis(R_te, cand[:, :B], 1)  # B heavy calls per query
            order = np.argsort(-true, axis=1, kind="stable")
            ranked = np.hstack([np.take_along_axis(cand[:, :B], order, 1), cand[:, B:]])
            return {"B": B, metric: hit_rate(R_te, ranked[:, :K])}
        return run

    def rbe(k, support):
        return RelevanceBasedRetriever(heavy, n_support=k, support=support, random_state=0)

    makers = {"AnnCUR": lambda k: AnnCURRetriever(heavy, n_support=k, random_state=0)}
    for s in ("random", "popular", "kmeans", "farthest", "greedy"):
        makers[f"RBE-{s}"] = partial(rbe, support=s)
    makers["RBE-greedy+MLP"] = lambda k: RelevanceBasedRetriever(
        heavy, n_support=k, head="mlp", max_iter=mlp_iter, lr=1e-3, random_state=0)
    cases = [Case("brute force", brute)]
    for B in budgets:
        # the neural head is the slow row on CPU: only at the two smallest budgets
        names = [n for n in makers if "MLP" not in n or B <= budgets[1]]
        cases += [Case(f"{name} B={B}", cur_case(makers[name], B)) for name in names]
        cases.append(Case(f"two-tower B={B}", dual(B)))
    return cases


if __name__ == "__main__":
    benchmark_main(make_cases, baseline="brute force",
                   title="RBE: HitRate@K vs online heavy calls per query (synthetic)")
