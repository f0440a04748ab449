"""Properties that must hold for every valid input, on inputs hypothesis generates (RBE).

Relations checked here (and not by the example-based tests): the linear head is the
least-squares projection whatever the shapes (more supports than queries, duplicated or
constant columns), its invariance to invertible mixes of the supports and its
equivariance to scaling / shifting / permuting the relevance; the structure of every
support selector (distinct in-range picks, nested greedy sets whose gains are the exact
MSE drops, early stops only at zero residual); metric and loss bounds; and the
consistency of the retrievers' outputs (``predict`` vs ``transform_queries`` vs
``kneighbors`` vs re-ranking vs ``score``, exact heavy-call counts) on generated
relevance tables full of ties.

The heavy ranker is a lookup in a generated table ``T`` (queries and items are row and
column indices), so every relevance is known exactly. ``PROP_EXAMPLES`` raises the number
of examples for local exploration (``HYPOTHESIS_PROFILE=explore PROP_EXAMPLES=500``).
"""

import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlpapers.retrieval.rbe import (
    AdaCURRetriever,
    RelevanceBasedRetriever,
    cur_query_weights,
    fit_linear_embeddings,
    hit_rate,
    select_support,
    softmax_signed_loss,
)

from ._counting import CountingRelevance


def _n(default: int) -> int:
    return int(os.environ.get("PROP_EXAMPLES", default))


def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


@st.composite
def relevance(draw, min_rows=1, max_rows=12, min_cols=1, max_cols=10, float32=False):
    """A relevance table: small integers (ties, duplicated and constant columns) or
    continuous values, at a generated scale. ``float32``: no magnitude below 1e-6 (the
    neural head runs in float32, where values below ~1e-38 flush to zero)."""
    n, N = draw(st.integers(min_rows, max_rows)), draw(st.integers(min_cols, max_cols))
    if draw(st.booleans()):
        T = draw(hnp.arrays(np.float64, (n, N), elements=st.integers(-3, 3).map(float)))
    else:
        # no magnitude below 1e-250: the plain (standardize=False) pseudo-inverse of a
        # subnormal 1e-311 is 1/1e-311 = inf, as for any float64 inverse (out of scope)
        small = 1e-6 if float32 else 1e-250
        el = st.floats(-5, 5).filter(lambda v: v == 0 or abs(v) >= small)
        T = draw(hnp.arrays(np.float64, (n, N), elements=el))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    return T * scale


def _affine_fit(A, R, center, scale_free=None):
    """Least-squares fitted values of every column of R from the columns of A (plus an
    intercept when ``center``): the orthogonal projection, unique whatever the rank.

    ``scale_free`` (default: ``center``) computes it on centred columns of unit norm, so
    a support column that varies little relative to its offset (2e-19 around 2e-19) is
    not mistaken for a multiple of the intercept by lstsq's relative cutoff, as the
    standardised head and the (per-item relative) greedy tolerance do. Without it, the
    raw columns meet lstsq's cutoff ``max(n, k) * eps`` relative to the largest singular
    value: the documented pseudo-inverse of the plain (``standardize=False``) head.
    """
    scale_free = center if scale_free is None else scale_free
    mean_r = R.mean(0) if center else 0.0
    A = A - A.mean(0) if center else A
    A = np.where(np.ptp(A, axis=0) == 0, 0.0, A) if center else A
    if scale_free:  # (norms of scaled columns: squares of 1e-200 would underflow)
        top = np.abs(A).max(0, initial=0.0)
        norms = top * np.linalg.norm(A / np.where(top > 0, top, 1.0), axis=0)
    else:
        norms = np.ones(A.shape[1])
    A = A[:, norms > 0] / norms[norms > 0]
    if A.shape[1] == 0:
        return np.broadcast_to(mean_r, R.shape) + 0.0 * R
    coef, *_ = np.linalg.lstsq(A, R - mean_r, rcond=None)
    return A @ coef + mean_r


def _linear_predict(out, R_sup_new):
    return ((_t(R_sup_new) - out["mean"]) / out["scale"]) @ out["embeddings"].T + out["offsets"]


def _neg(a):
    """The same values as ``a`` in a view with a negative stride (also along an axis of
    length 1, which numpy calls C-contiguous)."""
    return a[..., ::-1].copy()[..., ::-1]


def _tol(R):
    return 1e-8 * (np.abs(R).max() + 1e-300)


# -- the linear head -----------------------------------------------------------------
@settings(max_examples=_n(40), deadline=None)
@given(R=relevance(), data=st.data(), standardize=st.booleans())
def test_linear_head_is_the_least_squares_projection_for_any_shape(R, data, standardize):
    n_q, N = R.shape
    k = data.draw(st.integers(1, N))
    S = np.asarray(data.draw(st.permutations(range(N))))[:k]
    out = fit_linear_embeddings(_t(R[:, S]), _t(R), standardize=standardize)
    fitted = _linear_predict(out, R[:, S]).numpy()
    # on the training queries the fit is the projection onto span(R[:, S] (, 1)),
    # unique even when k > n_queries or the support columns are dependent
    np.testing.assert_allclose(fitted, _affine_fit(R[:, S], R, standardize), rtol=0,
                               atol=_tol(R) * max(n_q, N))
    # a support item is reproduced exactly (it is in its own span)
    np.testing.assert_allclose(fitted[:, S], R[:, S], rtol=0, atol=_tol(R) * max(n_q, N))


@settings(max_examples=_n(40), deadline=None)
@given(R=relevance(min_rows=4), data=st.data(), standardize=st.booleans())
def test_linear_head_depends_only_on_the_span_of_the_supports(R, data, standardize):
    n_q, N = R.shape
    k = data.draw(st.integers(1, min(N, n_q - 2)))
    S = np.asarray(data.draw(st.permutations(range(N))))[:k]
    A = R[:, S]
    # full column rank with the intercept: predictions for new queries are then unique
    assume(np.linalg.matrix_rank(np.hstack([A, np.ones((n_q, 1))]), tol=1e-6 * (
        np.abs(A).max() + 1)) == k + 1)
    M = data.draw(hnp.arrays(np.float64, (k, k), elements=st.floats(-2, 2)))
    M = M + 3.0 * np.eye(k)
    assume(np.linalg.cond(M) < 1e3)
    new = data.draw(hnp.arrays(np.float64, (3, N), elements=st.floats(-5, 5)))
    a = fit_linear_embeddings(_t(A), _t(R), standardize=standardize)
    b = fit_linear_embeddings(_t(A @ M), _t(R), standardize=standardize)
    pa = _linear_predict(a, new[:, S]).numpy()
    pb = _linear_predict(b, new[:, S] @ M).numpy()
    cond = np.linalg.cond(np.hstack([A, np.ones((n_q, 1))]))
    atol = 1e-10 * cond * (np.abs(R).max() + np.abs(new).max()) * max(n_q, N)
    np.testing.assert_allclose(pb, pa, rtol=0, atol=atol)
    if standardize:  # an affine fit: a shift of a support column changes nothing either
        shift = data.draw(hnp.arrays(np.float64, k, elements=st.floats(-10, 10)))
        c = fit_linear_embeddings(_t(A + shift), _t(R), standardize=True)
        np.testing.assert_allclose(_linear_predict(c, new[:, S] + shift).numpy(), pa, rtol=0,
                                   atol=atol * 10)


@settings(max_examples=_n(30), deadline=None)
@given(R=relevance(), data=st.data(),
       value=st.sampled_from([0.1, -3.0, 1e3, -1e20]),
       solve=st.sampled_from([{}, {"rcond": 1e-12}, {"ridge": 1e-3}]))
def test_a_constant_support_column_changes_no_prediction(R, data, value, solve):
    """With ``standardize``, a support column constant over the training queries carries
    nothing: adding it changes no prediction, for new queries whatever their value in
    that column, with the default cutoff, an explicit ``rcond`` or a ridge. (Its computed
    std is rounding noise, 1.4e-17 for a column of 0.1: dividing by it amplified a new
    query's deviation from the constant by 1e17; a large constant also inflated the
    default cutoff and dropped every singular value.)"""
    n_q, N = R.shape
    k = data.draw(st.integers(1, N))
    S = np.asarray(data.draw(st.permutations(range(N))))[:k]
    # standardising divides by each column's spread: one of 1e-141 next to 1e-3 turns the
    # rounding of any coefficient into 1e120 for a new query, with or without the
    # constant column (out of scope: no such relevance is meaningful)
    spread = np.ptp(R[:, S], axis=0)
    assume(np.all((spread == 0) | (spread >= 1e-8 * np.abs(R).max())))
    new = data.draw(hnp.arrays(np.float64, (3, N), elements=st.floats(-5, 5)))
    base = fit_linear_embeddings(_t(R[:, S]), _t(R), standardize=True, **solve)
    with_const = fit_linear_embeddings(_t(np.column_stack([R[:, S], np.full(n_q, value)])),
                                       _t(R), standardize=True, **solve)
    new_const = np.column_stack([new[:, S], value + np.array([0.0, 1.0, -7.5])])
    np.testing.assert_allclose(_linear_predict(with_const, new_const).numpy(),
                               _linear_predict(base, new[:, S]).numpy(), rtol=1e-9,
                               atol=_tol(R) * max(n_q, N) * 10)


@pytest.mark.parametrize("solve", [{}, {"rcond": 1e-12}, {"ridge": 1e-3}])
def test_a_constant_support_column_of_0_1_changes_no_prediction(solve):
    # found by the property above (with the constant-column handling removed): a
    # support column of 0.1 has a computed std of rounding size, and a new query at
    # 0.1 + 1 was amplified by it
    R = np.zeros((6, 2))
    R[5, 1] = 1e-3
    base = fit_linear_embeddings(_t(R[:, :1]), _t(R), standardize=True, **solve)
    with_const = fit_linear_embeddings(_t(np.column_stack([R[:, :1], np.full(6, 0.1)])),
                                       _t(R), standardize=True, **solve)
    new = np.array([[0.0, 0.1], [2.0, 1.1], [-1.0, -7.4]])
    np.testing.assert_allclose(_linear_predict(with_const, new).numpy(),
                               _linear_predict(base, new[:, :1]).numpy(), rtol=0, atol=1e-15)


@settings(max_examples=_n(30), deadline=None)
@given(R=relevance(), data=st.data(), standardize=st.booleans(),
       c=st.sampled_from([2.0**-20, 0.5, 4.0, 2.0**20]),
       t=st.integers(-400, 400).map(lambda i: i / 4.0))
def test_linear_head_is_equivariant_to_scaling_shifting_and_permuting_the_relevance(
        R, data, standardize, c, t):
    n_q, N = R.shape
    k = data.draw(st.integers(1, N))
    S = np.asarray(data.draw(st.permutations(range(N))))[:k]
    new = data.draw(hnp.arrays(np.float64, (2, N), elements=st.floats(-5, 5)))
    base = _linear_predict(fit_linear_embeddings(_t(R[:, S]), _t(R), standardize=standardize),
                           R[:, S]).numpy()
    atol = _tol(R) * max(n_q, N) * 10
    # (powers of two: the scaled problem is exact, whatever the conditioning of R[:, S])
    scaled = fit_linear_embeddings(_t(c * R[:, S]), _t(c * R), standardize=standardize)
    np.testing.assert_allclose(_linear_predict(scaled, c * R[:, S]).numpy(), c * base, rtol=0,
                               atol=c * atol)
    if standardize:
        # the item intercepts absorb a common shift of the relevance, on a copy of R on
        # a dyadic grid (multiples of 2**-20) where R + t is exact (a shift that rounds,
        # 2.6e-90 + 0.25 = 0.25, makes a different matrix)
        R = np.round(R * 2.0**20) / 2.0**20
        base = _linear_predict(fit_linear_embeddings(_t(R[:, S]), _t(R), standardize=True),
                               R[:, S]).numpy()
        assert np.array_equal((R + t) - t, R)
        shifted = fit_linear_embeddings(_t(R[:, S] + t), _t(R + t), standardize=True)
        np.testing.assert_allclose(_linear_predict(shifted, R[:, S] + t).numpy(), base + t,
                                   rtol=0, atol=atol + 1e-9 * abs(t) * max(n_q, N))
    perm = np.asarray(data.draw(st.permutations(range(N))))
    # the same supports, the items listed in another order: predictions permute alike
    pe = fit_linear_embeddings(_t(R[:, S]), _t(R[:, perm]), standardize=standardize)
    np.testing.assert_allclose(_linear_predict(pe, R[:, S]).numpy(), base[:, perm], rtol=0,
                               atol=atol)
    qperm = np.asarray(data.draw(st.permutations(range(n_q))))
    qe = fit_linear_embeddings(_t(R[qperm][:, S]), _t(R[qperm]), standardize=standardize)
    np.testing.assert_allclose(_linear_predict(qe, new[:, S]).numpy(),
                               _linear_predict(fit_linear_embeddings(
                                   _t(R[:, S]), _t(R), standardize=standardize),
                                   new[:, S]).numpy(),
                               rtol=0, atol=1e-6 * (np.abs(R).max() + np.abs(new).max()) * N)


# -- support selection ---------------------------------------------------------------
def _residual_mse(R, S, center):
    if len(S) == 0:
        X = R - R.mean(0) if center else R
        return float(np.mean(X ** 2))
    return float(np.mean((R - _affine_fit(R[:, S], R, center, scale_free=True)) ** 2))


@settings(max_examples=_n(40), deadline=None)
@given(R=relevance(), data=st.data(), center=st.booleans(),
       greedy_method=st.sampled_from(["auto", "gram", "lowrank"]))
def test_greedy_picks_are_nested_with_gains_equal_to_the_exact_mse_drops(
        R, data, center, greedy_method):
    n_q, N = R.shape
    k = data.draw(st.integers(1, N))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        S, gains = select_support(R, k, "greedy", center=center, greedy_method=greedy_method,
                                  return_scores=True)
    stopped = any("stopped after" in str(w.message) for w in caught)
    assert 1 <= len(S) <= k or (len(S) == 0 and stopped)
    assert len(set(S.tolist())) == len(S) and np.all((S >= 0) & (S < N))
    assert stopped == (len(S) < k)
    total = _residual_mse(R, [], center)
    tol = 1e-7 * total + 1e-300
    before = total
    for t in range(len(S)):
        after = _residual_mse(R, S[:t + 1], center)
        assert gains[t] == pytest.approx(before - after, abs=tol)  # exact MSE drop
        before = after
    assert np.all(gains >= -tol) and gains.sum() <= total + tol
    if len(S) < k:  # an early stop only once the relevance is reproduced exactly
        assert before <= 1e-9 * total + 1e-300
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k2 in range(1, len(S)):  # nested: fewer supports are a prefix of more
            np.testing.assert_array_equal(
                select_support(R, k2, "greedy", center=center, greedy_method=greedy_method),
                S[:k2])


@settings(max_examples=_n(40), deadline=None)
@given(R=relevance(), data=st.data(), center=st.booleans(), seed=st.integers(0, 2**16))
def test_every_selector_returns_k_distinct_items_with_its_documented_scores(
        R, data, center, seed):
    n_q, N = R.shape
    k = data.draw(st.integers(1, N))
    for method in ("random", "popular", "kmeans", "farthest"):
        S, scores = select_support(R, k, method, center=center, random_state=seed,
                                   return_scores=True)
        assert S.dtype == np.int64 and S.shape == scores.shape == (k,)
        assert len(set(S.tolist())) == k and np.all((S >= 0) & (S < N)), method
    mean = R.mean(0)
    S, scores = select_support(R, k, "popular", return_scores=True)
    np.testing.assert_array_equal(S, np.argsort(-mean, kind="stable")[:k])
    np.testing.assert_allclose(scores, mean[S], rtol=1e-12, atol=1e-12 * np.abs(R).max())
    # farthest point: each pick maximises the distance to the chosen set (values, so
    # that exact ties between candidates are allowed)
    X = R.T - R.T.mean(1, keepdims=True) if center else R.T
    X[np.ptp(R.T, axis=1) == 0] = 0.0 if center else X[np.ptp(R.T, axis=1) == 0]
    S, scores = select_support(R, k, "farthest", center=center, return_scores=True)
    tol = 1e-6 * (np.abs(X).max() + 1e-300) * np.sqrt(n_q)
    d0 = np.sqrt(((X - X.mean(0)) ** 2).sum(1))
    assert d0[S[0]] >= d0.max() - tol
    for t in range(1, k):
        dmin = np.sqrt(((X[:, None, :] - X[S[:t]][None]) ** 2).sum(-1)).min(1)
        dmin[S[:t]] = -1.0
        assert dmin[S[t]] >= dmin.max() - tol and scores[t] == pytest.approx(
            dmin.max(), abs=tol)
    # the random choice is seeded: same seed, same items
    np.testing.assert_array_equal(select_support(R, k, "random", random_state=seed),
                                  select_support(R, k, "random", random_state=seed))


@settings(max_examples=_n(30), deadline=None)
@given(R=relevance(min_rows=2, min_cols=2), data=st.data(),
       c=st.sampled_from([2.0**-20, 0.25, 8.0, 2.0**30]))
def test_centred_greedy_ignores_item_offsets_and_scale(R, data, c):
    n_q, N = R.shape
    k = data.draw(st.integers(1, N))
    offsets = data.draw(hnp.arrays(np.float64, N, elements=st.integers(-50, 50).map(float)))
    # only shifts that are exact in float64 (1 + 2e-19 is 1: another matrix)
    assume(np.array_equal((R + offsets) - offsets, R))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        S, g = select_support(R, k, "greedy", return_scores=True)
        S2, g2 = select_support(c * R, k, "greedy", return_scores=True)
        S3, g3 = select_support(R + offsets, k, "greedy", return_scores=True)
    # power-of-two scaling is exact: identical picks, gains scaled by c**2
    np.testing.assert_array_equal(S2, S)
    np.testing.assert_allclose(g2, c * c * g, rtol=1e-12, atol=0)
    # per-item offsets vanish in the centring (up to its rounding): the picks may differ
    # only between near-tied candidates, so compare what they explain
    total = _residual_mse(R, [], True)
    tol = 1e-6 * total + 1e-300
    assert abs(len(S3) - len(S)) <= 1 or total == 0
    m = min(len(S), len(S3))
    for t in range(1, m + 1):
        assert _residual_mse(R, S3[:t], True) == pytest.approx(_residual_mse(R, S[:t], True),
                                                              abs=tol * t)


# -- metrics and loss ----------------------------------------------------------------
@settings(max_examples=_n(50), deadline=None)
@given(T=relevance(max_cols=12), data=st.data())
def test_hit_rate_bounds_and_invariances(T, data):
    n, N = T.shape
    k = data.draw(st.integers(1, N))
    m = data.draw(st.integers(k, N + 3))
    P = data.draw(hnp.arrays(np.int64, (n, m), elements=st.integers(0, N - 1)))
    h = hit_rate(T, P, k)
    distinct = np.mean([len(set(row[:k].tolist())) for row in P]) / k
    assert 0.0 <= h <= distinct + 1e-12
    top = np.argsort(-T, axis=1, kind="stable")
    assert hit_rate(T, top[:, :k]) == 1.0  # the heavy ranker's own top-k
    # the order inside the first k does not matter; scaling and shifting the truth
    # by powers of two does not change the stable ranking
    assert hit_rate(T, P[:, :k][:, ::-1], k) == h
    assert hit_rate(4.0 * T, P, k) == h
    # any memory layout of the same values (views with negative strides included)
    assert hit_rate(_neg(T), _neg(P), k) == h
    assert hit_rate(torch.from_numpy(T), torch.from_numpy(P), k) == h
    # HitRate is a mean over queries
    per = [hit_rate(T[i:i + 1], P[i:i + 1], k) for i in range(n)]
    assert h == pytest.approx(np.mean(per), abs=1e-12)


@settings(max_examples=_n(50), deadline=None)
@given(T=relevance(max_rows=6, min_cols=1, max_cols=40),
       L=st.data(), q=st.floats(0.01, 0.999))
def test_softmax_signed_loss_bounds_positives_and_logit_shift(T, L, q):
    n, m = T.shape
    logits = L.draw(hnp.arrays(np.float64, (n, m), elements=st.floats(-20, 20)))
    shift = L.draw(hnp.arrays(np.float64, (n, 1), elements=st.floats(-50, 50)))
    lt, tt = torch.from_numpy(logits), torch.from_numpy(T)
    loss = softmax_signed_loss(lt, tt, q)
    assert -1.0 / m - 1e-12 <= float(loss) <= 1.0 / m + 1e-12
    # the positives are the sampled items at or above the torch.quantile threshold;
    # the best item of every query is always one of them
    thr = torch.quantile(tt, q, dim=1, keepdim=True)
    sign = torch.where(tt >= thr, 1.0, -1.0)
    p = torch.softmax(lt, dim=1)
    torch.testing.assert_close(loss, -(sign * p).mean(), rtol=1e-12, atol=1e-15)
    assert bool((tt.max(1, keepdim=True).values >= thr).all())
    # softmax ignores a per-query shift of the logits
    torch.testing.assert_close(softmax_signed_loss(lt + torch.from_numpy(shift), tt, q), loss,
                               rtol=1e-9, atol=1e-12)


@settings(max_examples=_n(40), deadline=None)
@given(b=st.integers(1, 3), m=st.integers(1, 6), n_a=st.integers(1, 6), data=st.data(),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_cur_query_weights_are_the_pseudo_inverse_solution(b, m, n_a, data, scale):
    # integer anchor relevance: duplicated anchors and exact rank deficiency
    C = data.draw(hnp.arrays(np.float64, (b, m, n_a), elements=st.integers(-3, 3).map(float)))
    u = data.draw(hnp.arrays(np.float64, (b, m), elements=st.floats(-5, 5)))
    C, u = C * scale, u * scale
    w = cur_query_weights(_t(C), _t(u)).numpy()
    # w = pinv(A_I^T) u: the minimum-norm least-squares fit of u by the anchors' rows;
    # nonzero singular values of a small integer matrix are far above the cutoff
    for i in range(b):
        pinv = np.linalg.pinv(C[i], rcond=1e-8)
        ref = pinv @ u[i]
        # (rounding relative to ||pinv|| ||u||: ref itself may be 0 up to rounding)
        atol = 1e-9 * np.linalg.norm(pinv, 2) * np.abs(u[i]).max() * np.sqrt(m) + 1e-300
        np.testing.assert_allclose(w[i], ref, rtol=1e-7, atol=atol)
        # the approximation of the anchors' own scores is the projection of u
        proj = C[i] @ np.linalg.lstsq(C[i], u[i], rcond=None)[0]
        np.testing.assert_allclose(C[i] @ w[i], proj, rtol=0,
                                   atol=1e-7 * (np.abs(u[i]).max() + 1e-300))
    # batching: each query's weights do not depend on the others
    np.testing.assert_allclose(cur_query_weights(_t(C[:1]), _t(u[:1])).numpy(), w[:1],
                               rtol=1e-12, atol=1e-12 * (np.abs(w).max() + 1e-300))


# -- the retrievers on generated relevance tables ------------------------------------
@st.composite
def table_problem(draw, min_train=1, float32=False):
    """A relevance table (queries x items) split into training and test queries; the
    heavy ranker is a lookup, queries and items are row and column indices."""
    T = draw(relevance(min_rows=min_train + 1, max_rows=14, min_cols=1, max_cols=12,
                       float32=float32))
    n_train = draw(st.integers(min_train, len(T) - 1))
    return T, n_train


def _lookup(T):
    return CountingRelevance(lambda q, i: T[np.asarray(q)[:, None], np.asarray(i)[None, :]])


@settings(max_examples=_n(30), deadline=None)
@given(prob=table_problem(), data=st.data(),
       support=st.sampled_from(["greedy", "random", "popular", "kmeans", "farthest", "explicit"]),
       standardize=st.booleans(), ridge=st.sampled_from([0.0, 0.5]), batch=st.integers(1, 5))
def test_retriever_outputs_are_mutually_consistent(prob, data, support, standardize, ridge,
                                                   batch):
    T, n_train = prob
    N = T.shape[1]
    train, test, items = np.arange(n_train), np.arange(n_train, len(T)), np.arange(N)
    heavy = _lookup(T)
    k = data.draw(st.integers(1, N))
    if support == "explicit":
        support = np.asarray(data.draw(st.permutations(range(N))))[:k]
    est = RelevanceBasedRetriever(heavy, n_support=k, support=support, standardize=standardize,
                                  ridge=ridge, batch_size=batch, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # greedy may stop early (checked elsewhere)
        est.fit(train, items)
    assert heavy.pairs == est.n_heavy_calls_ == n_train * N
    S = est.support_indices_
    m = len(S)
    assert m <= k and len(set(S.tolist())) == m
    heavy.pairs = 0
    U = est.transform_queries(test)
    assert U.shape == (len(test), m) and heavy.pairs == len(test) * m  # k calls per query
    P = est.predict(test)
    assert P.shape == (len(test), N) and np.isfinite(P).all()
    np.testing.assert_allclose(P, U @ est.item_embeddings_.T + est.item_offsets_, rtol=1e-12,
                               atol=1e-12 * (np.abs(P).max() + 1))
    # kneighbors is the stable top-n of predict (same chunks: bitwise equal scores)
    n_nb = data.draw(st.integers(1, N))
    sims, idx = est.kneighbors(test, n_nb)
    ref = np.argsort(-P, axis=1, kind="stable")[:, :n_nb]
    np.testing.assert_array_equal(idx, ref)
    np.testing.assert_array_equal(sims, np.take_along_axis(P, ref, 1))
    # on the training queries the linear head is the least-squares projection
    if ridge == 0 and m:
        fit = _affine_fit(T[train][:, S], T[train], standardize)
        np.testing.assert_allclose(est.predict(train), fit, rtol=0,
                                   atol=_tol(T) * max(n_train, N) * 10)
    # re-ranking n_rerank candidates: heavy scores, descending, among the candidates
    n_rr = data.draw(st.integers(n_nb, N))
    est.set_params(n_rerank=n_rr)
    heavy.pairs = 0
    rs, ri = est.kneighbors(test, n_nb)
    assert heavy.pairs == len(test) * (m + n_rr)
    cand = np.argsort(-P, axis=1, kind="stable")[:, :n_rr]
    assert all(set(r) <= set(c) for r, c in zip(ri.tolist(), cand.tolist()))
    truth = T[test]
    np.testing.assert_array_equal(rs, np.take_along_axis(truth, ri, 1))
    best = -np.sort(-np.take_along_axis(truth, cand, 1), axis=1)[:, :n_nb]
    np.testing.assert_array_equal(rs, best)
    if n_rr == N:  # re-ranking everything is exact search
        assert est.score(test, truth, n_neighbors=n_nb) == 1.0
    assert est.score(test, truth, n_nb) == est.score(test, n_neighbors=n_nb) == hit_rate(
        truth, ri, n_nb)


@settings(max_examples=_n(20), deadline=None)
@given(prob=table_problem(min_train=2, float32=True), data=st.data(),
       hidden=st.sampled_from([0, 3]))
def test_untrained_neural_head_equals_the_linear_head(prob, data, hidden):
    T, n_train = prob
    N = T.shape[1]
    train, test, items = np.arange(n_train), np.arange(n_train, len(T)), np.arange(N)
    k = data.draw(st.integers(1, N))
    S = np.asarray(data.draw(st.permutations(range(N))))[:k]
    kw = dict(n_support=k, support=S, random_state=0)
    lin = RelevanceBasedRetriever(_lookup(T), **kw).fit(train, items)
    mlp = RelevanceBasedRetriever(_lookup(T), head="mlp", mlp_hidden=hidden, max_iter=0,
                                  validation_fraction=0.0, **kw).fit(train, items)
    P = lin.predict(test)
    # float32 head: rounding of ~k products of the standardised inputs and embeddings
    scale = (np.abs(lin.transform_queries(test)) @ np.abs(lin.item_embeddings_).T
             + np.abs(lin.item_offsets_) + np.abs(P))
    np.testing.assert_allclose(mlp.predict(test), P, rtol=0, atol=float(1e-5 * scale.max()))


@settings(max_examples=_n(25), deadline=None)
@given(prob=table_problem(), data=st.data(),
       init=st.sampled_from(["random", "greedy", "popular", "farthest"]))
def test_adacur_outputs_are_exact_at_the_anchors_and_consistent(prob, data, init):
    T, n_train = prob
    N = T.shape[1]
    train, test, items = np.arange(n_train), np.arange(n_train, len(T)), np.arange(N)
    n_calls = data.draw(st.integers(1, N))
    n_rounds = data.draw(st.integers(1, n_calls))
    heavy = _lookup(T)
    ada = AdaCURRetriever(heavy, n_calls=n_calls, n_rounds=n_rounds, init=init,
                          random_state=0).fit(train, items)
    assert ada.round_sizes_.sum() == n_calls and len(ada.initial_anchors_) == ada.round_sizes_[0]
    heavy.pairs = 0
    S, anchors = ada.predict(test, return_anchors=True)
    assert heavy.pairs == len(test) * n_calls  # the budget, exactly
    assert anchors.shape == (len(test), n_calls)
    assert all(len(set(row)) == n_calls for row in anchors.tolist())  # distinct anchors
    np.testing.assert_array_equal(anchors[:, :len(ada.initial_anchors_)],
                                  np.tile(ada.initial_anchors_, (len(test), 1)))
    # the scored items carry their exact heavy scores
    np.testing.assert_array_equal(np.take_along_axis(S, anchors, 1),
                                  np.take_along_axis(T[test], anchors, 1))
    if n_calls == N:
        np.testing.assert_array_equal(S, T[test])
    n_nb = data.draw(st.integers(1, N))
    sims, idx = ada.kneighbors(test, n_nb)
    ref = np.argsort(-S, axis=1, kind="stable")[:, :n_nb]
    np.testing.assert_array_equal(idx, ref)
    np.testing.assert_array_equal(sims, np.take_along_axis(S, ref, 1))


# -- regressions found by the properties above ----------------------------------------
def test_shifted_affinely_dependent_supports_keep_the_projection():
    # hypothesis shrank this: supports r0, r1 with r0 + r1 constant over the training
    # queries. Shifted by 1, centring them leaves a singular value of 1.9e-13 (rounding)
    # that the default cutoff max(n, k) * eps kept: the pseudo-inverse amplified it and
    # every fitted value came out near the item mean (1.3e-3 off on values of spread 1e-3)
    R = np.array([[0.001] * 4, [0.001] * 4, [0.002, 0.0, 0.001, 0.001]])
    for shift in (0.0, 1.0, 1e3):
        Rs = R + shift
        out = fit_linear_embeddings(_t(Rs[:, [0, 1]]), _t(Rs))
        fitted = _linear_predict(out, Rs[:, [0, 1]]).numpy()
        np.testing.assert_allclose(fitted, _affine_fit(Rs[:, [0, 1]], Rs, True), rtol=0,
                                   atol=1e-9 * (1 + shift))
        np.testing.assert_allclose(fitted[:, :2], Rs[:, :2], rtol=0, atol=1e-9 * (1 + shift))


def test_index_arrays_with_a_negative_stride_on_a_length_one_axis():
    # ``idx[:, ::-1]`` of a one-column ranking is a view numpy calls C-contiguous but
    # torch rejects (negative stride): hit_rate raised a ValueError about strides
    T = np.array([[0.1, 0.9, 0.5], [3.0, 2.0, 1.0]])
    idx = np.array([[1], [0]])[:, ::-1]
    assert idx.strides[1] < 0
    assert hit_rate(T, idx) == 1.0


def test_reranking_every_item_is_exact_search_with_tied_relevance():
    # graded relevance (ties): re-ranking all items kept the predicted order among tied
    # heavy scores, so the result differed from the exact top-k (ties to the lower item
    # index) and HitRate fell below 1 (hypothesis: 0.857 on a 0/0.001 table)
    T = np.zeros((8, 8))
    T[0, 6] = T[1, 5] = T[1, 6] = 1.0
    T[2:, 3] = 2.0
    T[4:, 0] = 2.0
    heavy = _lookup(T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = RelevanceBasedRetriever(heavy, n_support=1, n_rerank=8, standardize=False,
                                      random_state=0).fit(np.arange(2), np.arange(8))
    test = np.arange(1, 8)
    for k in (1, 2, 3):
        idx = est.kneighbors(test, k, return_distance=False)
        np.testing.assert_array_equal(idx, np.argsort(-T[test], axis=1, kind="stable")[:, :k])
        assert est.score(test, T[test], n_neighbors=k) == 1.0


@pytest.mark.parametrize("scale", [1e-150, 1e-80, 1.0, 1e80, 1e150])
def test_greedy_gains_survive_data_far_from_unit_scale(scale):
    # hypothesis shrank R = [[4e-144]]: the scores ||G_j||^2 / G_jj are formed from
    # ||G_j||^2 ~ |R|**4, which underflowed to 0 (every gain 0) below |R| ~ 1e-77 and
    # overflowed above ~1e77; the picks and the gains / scale**2 do not depend on it
    R = np.random.default_rng(0).standard_normal((12, 9))
    for center in (True, False):
        S, g = select_support(R, 5, "greedy", center=center, return_scores=True)
        Ss, gs = select_support(R * scale, 5, "greedy", center=center, return_scores=True)
        np.testing.assert_array_equal(Ss, S)
        np.testing.assert_allclose(gs / scale**2, g, rtol=1e-6)
        assert _residual_mse(R, [], center) == pytest.approx(
            g.sum() + _residual_mse(R, S, center), rel=1e-9)


def test_greedy_never_repicks_an_item_whose_squared_pivot_underflows():
    # hypothesis shrank R = [[5.5e-114, 1e-3]]: the explicit Gram deflation divides
    # g g^T by g_j, whose square (3e-227 ** 2) underflows, so G_jj stayed and item 0 was
    # picked twice ([0, 0]); e.g. sigmoid scores of 1e-114 next to scores of 1e-3
    R = np.array([[5.5029526e-114, 1e-3], [0.0, 0.0]])
    for method in ("gram", "lowrank"):
        # one query direction: either item spans the other, so greedy stops after one
        with pytest.warns(UserWarning, match="stopped after 1 of 2"):
            S, gains = select_support(R, 2, "greedy", center=False, greedy_method=method,
                                      return_scores=True)
        assert len(set(S.tolist())) == len(S) == 1
        assert gains.sum() == pytest.approx(np.mean(R ** 2), rel=1e-12)
