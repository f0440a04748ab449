"""Memory and time of relevance-based retrieval at user scale (10**4 - 10**5 items).

Memory is measured in a fresh interpreter (``tests._scale.peak_mb``); time fixes are
tested by their result (equal to the stable full sort they replace) and by a count
of the work done (no full sort of an item-sized row), never by wall-clock time.
"""

import numpy as np
import pytest
import torch

from mlpapers.retrieval.rbe import AdaCURRetriever, RelevanceBasedRetriever, greedy_selection
from mlpapers.retrieval.rbe import _kernels as rbe_kernels
from mlpapers.retrieval.rbe._kernels import CHUNK_SCORES, hit_counts, stable_topk, topk_scores
from tests._scale import peak_mb, requires_peak_rss


def _dot(q, i):
    return np.asarray(q) @ np.asarray(i).T


def _reference_topk(S, k):
    order = torch.argsort(S, dim=1, descending=True, stable=True)[:, :k]
    return S.gather(1, order), order


@pytest.mark.parametrize("k", [1, 3, 7, 40])
def test_stable_topk_is_the_stable_descending_sort(k):
    # ties inside, across and straddling the k-th place, signed zeros, NaN and -inf
    rng = np.random.default_rng(k)
    S = torch.as_tensor(rng.integers(-3, 4, size=(64, 40)).astype(np.float64))
    S[0] = 0.0
    S[1, ::2] = -0.0
    S[2, 5] = torch.nan
    S[3, :] = -torch.inf
    S[4] = torch.as_tensor(rng.standard_normal(40))
    v, i = stable_topk(S, k)
    rv, ri = _reference_topk(S, k)
    assert torch.equal(i, ri)
    assert torch.equal(v.isnan(), rv.isnan())
    assert torch.equal(torch.nan_to_num(v), torch.nan_to_num(rv))


def test_topk_scores_chunks_are_bounded_by_the_item_count(monkeypatch):
    # at most CHUNK_SCORES scores per chunk, whatever batch_size (a small cap here, so
    # that the test is cheap); the same result as one stable sort of the whole matrix
    monkeypatch.setattr(rbe_kernels, "CHUNK_SCORES", 1000)
    N, n = 301, 70
    S = torch.as_tensor(np.random.default_rng(3).integers(0, 9, size=(n, N)).astype(float))
    seen = []

    def score(a, b):
        seen.append(b - a)
        return S[a:b]

    v, i = topk_scores(score, n, 5, batch_size=1024, n_items=N)
    assert max(seen) * N <= 1000 and sum(seen) == n
    rv, ri = _reference_topk(S, 5)
    assert torch.equal(i, ri) and torch.equal(v, rv)


@pytest.fixture
def no_item_sized_sort(monkeypatch):
    """Record the row length of every ``torch.argsort`` / ``torch.sort`` call."""
    widths = []
    argsort, sort = torch.argsort, torch.sort

    def counting_argsort(x, *a, **kw):
        widths.append(x.shape[-1])
        return argsort(x, *a, **kw)

    def counting_sort(x, *a, **kw):
        widths.append(x.shape[-1])
        return sort(x, *a, **kw)

    monkeypatch.setattr(torch, "argsort", counting_argsort)
    monkeypatch.setattr(torch, "sort", counting_sort)
    return widths


def _problem(N=3000, n_train=80, n_test=50):
    rng = np.random.default_rng(0)
    Q, I = rng.standard_normal((n_train + n_test, 6)), rng.standard_normal((N, 6))
    return Q[:n_train], Q[n_train:], I


def test_kneighbors_selects_without_sorting_every_item(no_item_sized_sort):
    # a full stable sort of every query's N scores made kneighbors O(N log N) per
    # query (27.8 s for 1024 queries x 10**5 items, 1.4 s with topk)
    Qtr, Qte, I = _problem()
    est = RelevanceBasedRetriever(_dot, n_support=10, support="random", n_rerank=30,
                                  random_state=0).fit(Qtr, I)
    no_item_sized_sort.clear()
    s, idx = est.kneighbors(Qte, 10)
    assert max(no_item_sized_sort, default=0) < len(I)
    # the exact answer: re-ranking by the heavy scores of the 30 candidates
    scores = est.predict(Qte)
    cand = _reference_topk(torch.as_tensor(scores), 30)[1].numpy()
    heavy = np.take_along_axis(_dot(Qte, I), cand, axis=1)
    order = np.argsort(-heavy, axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(idx, np.take_along_axis(cand, order, axis=1))


def test_adacur_selects_without_sorting_every_item(no_item_sized_sort):
    # ADACUR sorted all N items of every query in every round (128 s -> 19 s for
    # 1024 queries x 10**5 items): the same anchors and answers by topk
    Qtr, Qte, I = _problem()
    ada = AdaCURRetriever(_dot, n_calls=12, n_rounds=3, random_state=0).fit(Qtr, I)
    no_item_sized_sort.clear()
    s, idx = ada.kneighbors(Qte, 10)
    assert max(no_item_sized_sort, default=0) < len(I)
    S, anchors = ada.predict(Qte, return_anchors=True)
    rs, ri = _reference_topk(torch.as_tensor(S), 10)
    np.testing.assert_array_equal(idx, ri.numpy())
    np.testing.assert_array_equal(s, rs.numpy())
    # anchors scored exactly, with the heavy ranker
    np.testing.assert_allclose(np.take_along_axis(S, anchors, 1),
                               np.take_along_axis(_dot(Qte, I), anchors, 1), rtol=1e-12)


def test_hit_counts_equal_the_sorted_definition():
    rng = np.random.default_rng(1)
    T = rng.integers(0, 5, size=(30, 200)).astype(np.float64)  # many ties
    P = rng.integers(0, 200, size=(30, 12))
    hits, k = hit_counts(T, P, 7)
    top = np.argsort(-T, axis=1, kind="stable")[:, :7]
    ref = [len(set(top[q]) & set(P[q, :7])) for q in range(30)]
    assert k == 7 and hits.tolist() == ref


def test_greedy_deflation_factors_are_not_regrown(monkeypatch):
    # L grew by torch.cat at every pick (quadratic copies: 30% of the selection of 200
    # of 2 * 10**4 items); the picks and gains are bitwise those of the Gram method's
    # definition up to rounding, and no concatenation runs per pick
    rng = np.random.default_rng(2)
    X = torch.as_tensor(rng.standard_normal((400, 60)))
    calls = []
    cat = torch.cat
    monkeypatch.setattr(torch, "cat", lambda *a, **kw: calls.append(1) or cat(*a, **kw))
    idx, gains = greedy_selection(X, 40, method="lowrank")
    assert len(calls) <= 1
    monkeypatch.undo()
    idx_g, gains_g = greedy_selection(X, 40, method="gram")
    assert torch.equal(idx, idx_g)
    torch.testing.assert_close(gains, gains_g, rtol=1e-9, atol=0)


_SETUP = """
import numpy as np, torch
torch.set_num_threads(1)
from mlpapers.retrieval.rbe import RelevanceBasedRetriever
rng = np.random.default_rng(0)
Q, I = rng.standard_normal((64, 4)), rng.standard_normal(({N}, 4))
fn = lambda q, i: np.asarray(q) @ np.asarray(i).T
est = RelevanceBasedRetriever(fn, n_support=8, support="random", random_state=0).fit(Q, I)
Qt = rng.standard_normal(({n}, 4))
"""


@requires_peak_rss
def test_kneighbors_memory_is_bounded_by_a_chunk_not_by_batch_size_items():
    # batch_size (1024) queries x N items were scored, then fully sorted, at once:
    # 3 x 1024 x 30 000 float64 = 0.7 GB at N = 30 000. Now a chunk holds at most
    # CHUNK_SCORES float64 scores (32 MiB); the call keeps the scores, the matmul's
    # temporary and topk's work (<= 3 chunks) plus a tiny output (1024 x 10).
    N, n = 30_000, 1024
    bound = 4 * CHUNK_SCORES * 8 / 2**20
    peak = peak_mb(_SETUP.format(N=N, n=n), "est.kneighbors(Qt, 10)")
    assert peak < bound, (peak, bound)


@requires_peak_rss
def test_neural_head_fit_makes_no_float64_copy_of_the_relevance():
    # the head trains on a float32 copy of the (n_fit, n_items) relevance, made from a
    # float64 copy divided by its unit even when the unit is 1, after an |R| copy to
    # find that unit: 2x the float64 matrix in all (300 - 304 MB for 153 MB). Left: the
    # float32 copy (0.5x) and what the linear fit alone takes (52 MB measured with
    # head="linear"), which the allocator keeps to a varying degree: 91 - 179 MB
    # measured over a dozen runs. The bound sits between the two.
    n_q, N = 400, 50_000
    setup = f"""
import numpy as np, torch
torch.set_num_threads(1)
from mlpapers.retrieval.rbe import RelevanceBasedRetriever
rng = np.random.default_rng(0)
Q, I = rng.standard_normal(({n_q}, 4)), rng.standard_normal(({N}, 4))
R = Q @ I.T
fn = lambda q, i: np.asarray(q) @ np.asarray(i).T
kw = dict(n_support=8, support="random", head="mlp", mlp_hidden=0, max_iter=1,
          validation_fraction=0.0, random_state=0)
RelevanceBasedRetriever(fn, **kw).fit(Q[:20], I[:50])  # warm-up: lazy first-use allocations
"""
    call = "RelevanceBasedRetriever(fn, **kw).fit(Q, I, relevance_matrix=R)"
    matrix_mb = n_q * N * 8 / 2**20
    peak = peak_mb(setup, call)
    bound = 1.55 * matrix_mb  # f32 copy (0.5x) + the linear fit (0.35x) + allocator
    assert peak < bound, (peak, bound)


def test_adacur_follows_in_place_changes_of_the_anchor_relevance():
    # max|A| was cached with the views of anchor_relevance_: scaling the matrix in
    # place after a first search left the Gram units stale (a LinAlgError from eigh at
    # 1e200); the views follow the change, and so must the maximum
    Qtr, Qte, I = _problem()
    ada = AdaCURRetriever(_dot, n_calls=12, n_rounds=3, random_state=0).fit(Qtr, I)
    ada.predict(Qte)
    ada.anchor_relevance_ *= 1e200
    fresh = AdaCURRetriever(_dot, n_calls=12, n_rounds=3, random_state=0).fit(Qtr, I)
    fresh.anchor_relevance_ = ada.anchor_relevance_.copy(order="K")
    np.testing.assert_array_equal(ada.predict(Qte), fresh.predict(Qte))


def test_neural_head_scores_all_items_as_its_forward():
    # the item side is computed once per call for chunked callers: bitwise forward's
    Qtr, Qte, I = _problem()
    rbe = RelevanceBasedRetriever(_dot, n_support=6, support="random", head="mlp",
                                  mlp_hidden=16, max_iter=5, random_state=0).fit(Qtr, I)
    U = torch.randn(7, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(rbe.head_.all_items_scorer()(U), rbe.head_(U))
