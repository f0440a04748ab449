"""Acceptance tests written from the text of issue #9 (retrieval.rbe) and its paper note.

Each test quotes the issue sentence it checks. Properties already covered elsewhere
(greedy MSE drops, nesting, invariances, call accounting, bad input) are not repeated.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import mlpapers.retrieval as retrieval
import mlpapers.retrieval.rbe as rbe
from mlpapers.retrieval import ExactMIPS
from mlpapers.retrieval.rbe import AnnCURRetriever, RelevanceBasedRetriever, select_support


def _problem(seed, n_q=70, n_te=25, n_items=60, d=6):
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((n_q + n_te, d))
    items = rng.standard_normal((n_items, d))
    W = rng.standard_normal((d, d))

    def heavy(q, i):  # a nonlinear ranker: the relevance is not low rank
        return np.tanh(np.asarray(q) @ W @ np.asarray(i).T) + 0.3 * np.asarray(i)[:, 0]

    return Q[:n_q], Q[n_q:], items, heavy


def test_public_api_names_signatures_and_fitted_attributes():
    # "Public API (`mlpapers.retrieval.rbe`, re-exported from `mlpapers.retrieval`):
    # RelevanceBasedRetriever(relevance_fn, n_support=100, support="greedy", head="linear",
    # n_rerank=0, ridge=0.0, standardize=True, ..., random_state, device, verbose)"
    for name in ("RelevanceBasedRetriever", "AnnCURRetriever", "select_support"):
        assert getattr(rbe, name) is getattr(retrieval, name)
    params = inspect.signature(RelevanceBasedRetriever).parameters
    assert next(iter(params)) == "relevance_fn"
    expected = dict(n_support=100, support="greedy", head="linear", n_rerank=0, ridge=0.0,
                    standardize=True, random_state=None, device="cpu", verbose=0)
    assert {k: params[k].default for k in expected} == expected
    assert list(inspect.signature(RelevanceBasedRetriever.fit).parameters)[1:] == [
        "train_queries", "items", "relevance_matrix"]
    # "support_indices_, item_embeddings_, selection_scores_, n_heavy_calls_"
    Qtr, Qte, items, heavy = _problem(11)
    k = 7
    est = RelevanceBasedRetriever(heavy, n_support=k, random_state=0).fit(Qtr, items)
    assert est.support_indices_.shape == (k,)
    assert len(set(est.support_indices_.tolist())) == k
    assert est.item_embeddings_.shape == (len(items), k)
    assert est.selection_scores_.shape == (k,)
    assert est.n_heavy_calls_ == len(Qtr) * len(items)
    # "predict(Q) (approximate scores)"; "kneighbors(Q, n_neighbors, return_distance)"
    assert est.predict(Qte).shape == (len(Qte), len(items))
    scores, idx = est.kneighbors(Qte, 4)
    np.testing.assert_array_equal(est.kneighbors(Qte, 4, False), idx)
    # "select_support(R, k, method) standalone"
    S = select_support(heavy(Qtr, items), k, "greedy")
    np.testing.assert_array_equal(S, est.support_indices_)


@pytest.mark.parametrize("hidden", [0, 16])
def test_disabled_mlp_head_reduces_to_linear_rbe_with_default_validation(hidden):
    # "the MLP head reduces to linear RBE when disabled": an untrained head
    # (max_iter=0) with the default validation_fraction used to fit its linear part
    # on 90 % of the training queries, so it was not the linear RBE of the same data.
    Qtr, Qte, items, heavy = _problem(5)
    lin = RelevanceBasedRetriever(heavy, n_support=6, random_state=1).fit(Qtr, items)
    mlp = RelevanceBasedRetriever(heavy, n_support=6, head="mlp", mlp_hidden=hidden,
                                  max_iter=0, random_state=1).fit(Qtr, items)
    np.testing.assert_array_equal(mlp.support_indices_, lin.support_indices_)
    # the head runs in float32
    np.testing.assert_allclose(mlp.predict(Qte), lin.predict(Qte), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mlp.kneighbors(Qte, 5, False), lin.kneighbors(Qte, 5, False))


def test_linear_scores_are_inner_products_of_the_embeddings():
    # "linear RBE e_i = pinv(R_tr[:, S]) R_tr[:, i] ..., score <u_q, e_i>": exactly so
    # with standardize=False (u_q the raw heavy scores); the standardised default adds
    # the affine fit's item intercept (documented in transform_items).
    Qtr, Qte, items, heavy = _problem(7)
    R = heavy(Qtr, items)
    plain = RelevanceBasedRetriever(heavy, n_support=5, standardize=False,
                                    random_state=2).fit(Qtr, items)
    S = plain.support_indices_
    U = plain.transform_queries(Qte)
    np.testing.assert_allclose(U, heavy(Qte, items[S]), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plain.transform_items(), (np.linalg.pinv(R[:, S]) @ R).T,
                               rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(plain.predict(Qte), U @ plain.transform_items().T,
                               rtol=1e-10, atol=1e-10)
    std = RelevanceBasedRetriever(heavy, n_support=5, random_state=2).fit(Qtr, items)
    np.testing.assert_allclose(
        std.predict(Qte),
        std.transform_queries(Qte) @ std.transform_items().T + std.item_offsets_,
        rtol=1e-10, atol=1e-10)


def _assert_no_near_ties(P, k):
    # the float32 index and the float64 retriever then agree on the top-k items
    top = -np.sort(-P, axis=1)[:, :k + 1]
    assert np.min(-np.diff(top, axis=1)) > 1e-4


def _mips_inputs(est, Q):
    keys = np.column_stack([est.transform_items(), est.item_offsets_])
    U = est.transform_queries(Q)
    return keys, np.column_stack([U, np.ones(len(U))])


@pytest.mark.parametrize("standardize", [True, False])
def test_exact_mips_over_item_embeddings_reproduces_kneighbors(standardize):
    # "retrieval by MIPS over item embeddings"; "Item-embedding retrieval can use
    # ExactMIPS": the recipe of the user guide (offsets appended as a last column).
    Qtr, Qte, items, heavy = _problem(3)
    est = RelevanceBasedRetriever(heavy, n_support=8, standardize=standardize,
                                  random_state=0).fit(Qtr, items)
    keys, queries = _mips_inputs(est, Qte)
    sims, idx = ExactMIPS().fit(keys).kneighbors(queries, n_neighbors=5)
    ours, ours_idx = est.kneighbors(Qte, 5)
    # ExactMIPS searches in float32: equal scores up to its rounding, the same items
    np.testing.assert_allclose(sims, ours, rtol=1e-5, atol=1e-5)
    _assert_no_near_ties(est.predict(Qte), 5)
    np.testing.assert_array_equal(idx, ours_idx)


def test_faiss_index_over_item_embeddings_reproduces_kneighbors():
    # "(and faiss when installed)"
    faiss = pytest.importorskip("faiss")
    Qtr, Qte, items, heavy = _problem(4)
    est = RelevanceBasedRetriever(heavy, n_support=8, random_state=0).fit(Qtr, items)
    keys, queries = _mips_inputs(est, Qte)
    index = faiss.IndexFlatIP(keys.shape[1])
    index.add(np.ascontiguousarray(keys, dtype=np.float32))
    sims, idx = index.search(np.ascontiguousarray(queries, dtype=np.float32), 5)
    ours, ours_idx = est.kneighbors(Qte, 5)
    np.testing.assert_allclose(sims, ours, rtol=1e-5, atol=1e-5)
    _assert_no_near_ties(est.predict(Qte), 5)
    np.testing.assert_array_equal(idx, ours_idx)


def test_anncur_is_linear_rbe_with_random_supports():
    # "AnnCURRetriever as the named baseline (random supports, linear head)"; note:
    # "Linear RBE with random S is AnnCUR": approximation R[q, I_a] pinv(R[Q_a, I_a]) R[Q_a, :]
    Qtr, Qte, items, heavy = _problem(9)
    cur = AnnCURRetriever(heavy, n_support=6, random_state=4).fit(Qtr, items)
    same = RelevanceBasedRetriever(heavy, n_support=6, support="random", head="linear",
                                   standardize=False, random_state=4).fit(Qtr, items)
    np.testing.assert_array_equal(cur.support_indices_, same.support_indices_)
    S, R = cur.support_indices_, heavy(Qtr, items)
    reference = heavy(Qte, items[S]) @ np.linalg.pinv(R[:, S]) @ R
    np.testing.assert_allclose(cur.predict(Qte), reference, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(same.predict(Qte), reference, rtol=1e-8, atol=1e-8)
