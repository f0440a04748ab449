"""Support selection and pure kernels of relevance-based embeddings (exact references)."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import cdist

from mlpapers.retrieval.rbe import (
    fit_linear_embeddings,
    greedy_selection,
    hit_rate,
    select_support,
    softmax_signed_loss,
)


def _residual_mse(R, S, center):
    """Training MSE of the least-squares reconstruction of every column from R[:, S]."""
    n_q = R.shape[0]
    A = R[:, S] if len(S) else np.zeros((n_q, 0))
    if center:
        A = np.hstack([A, np.ones((n_q, 1))])
    if A.shape[1] == 0:
        return float(np.mean(R ** 2))
    coef, *_ = np.linalg.lstsq(A, R, rcond=None)
    return float(np.mean((R - A @ coef) ** 2))


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("greedy_method", ["gram", "lowrank"])
def test_greedy_scores_equal_exact_mse_drop_and_are_maximal(center, greedy_method):
    rng = np.random.default_rng(0)
    R = rng.standard_normal((15, 4)) @ rng.standard_normal((4, 12)) + 0.3 * rng.standard_normal(
        (15, 12))
    S, scores = select_support(R, 6, "greedy", center=center, greedy_method=greedy_method,
                               return_scores=True)
    assert len(set(S.tolist())) == 6
    for t in range(6):
        before = _residual_mse(R, S[:t], center)
        np.testing.assert_allclose(scores[t], before - _residual_mse(R, S[:t + 1], center),
                                   rtol=1e-8, atol=1e-12)
        # the pick is the brute-force best single addition
        drops = [before - _residual_mse(R, np.r_[S[:t], j], center)
                 for j in range(12) if j not in S[:t]]
        assert scores[t] >= max(drops) - 1e-10
    assert np.all(scores >= -1e-12)  # training MSE non-increasing in k


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n_q=st.integers(3, 20), n_i=st.integers(3, 20),
       center=st.booleans())
def test_greedy_gram_and_lowrank_formulations_agree(seed, n_q, n_i, center):
    rng = np.random.default_rng(seed)
    R = rng.standard_normal((n_q, n_i))
    k = min(n_q, n_i) - 1 if center else min(n_q, n_i)
    k = max(k, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, sa = select_support(R, k, "greedy", center=center, greedy_method="gram",
                               return_scores=True)
        b, sb = select_support(R, k, "greedy", center=center, greedy_method="lowrank",
                               return_scores=True)
    # the pick that completes the span ties between every remaining item: compare
    # the picks before it, and all gains. The explicit Gram deflation cancels terms of
    # the size of the first gains, so its round-off scales with sa[0], not with the
    # (smaller) late gains (seed 743, 9x20: 1.5e-8 off brute force on a gain of 0.012).
    np.testing.assert_array_equal(a[:-1], b[:-1])
    np.testing.assert_allclose(sa, sb, rtol=1e-7, atol=1e-6 * max(sa.max(), 1e-12))


def test_greedy_sets_are_nested():
    R = np.random.default_rng(1).standard_normal((30, 25))
    full = select_support(R, 10, "greedy")
    for k in (1, 4, 7):
        np.testing.assert_array_equal(select_support(R, k, "greedy"), full[:k])


@pytest.mark.parametrize("center", [True, False])
def test_greedy_stops_after_rank_picks_with_zero_residual(center):
    rng = np.random.default_rng(2)
    r = 4
    R = rng.standard_normal((40, r)) @ rng.standard_normal((r, 30))
    with pytest.warns(UserWarning, match="stopped after 4 of 10"):
        S, scores = select_support(R, 10, "greedy", center=center, return_scores=True)
    assert len(S) == r
    assert _residual_mse(R, S, center) < 1e-20
    np.testing.assert_allclose(scores.sum(), _residual_mse(R, [], center), rtol=1e-9)


def test_greedy_never_picks_duplicates_or_zero_columns():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((20, 5))
    R = np.hstack([base, base[:, :2], np.zeros((20, 3))])
    with pytest.warns(UserWarning):
        S = select_support(R, 9, "greedy", center=False)
    assert len(S) == 5 and set(S.tolist()) <= set(range(5))


@pytest.mark.parametrize("const", [0.1, 1 / 3, np.pi])
def test_greedy_centred_never_picks_constant_items(const):
    # An item scored the same by every query carries nothing once centred; its centred
    # vector is rounding noise, which must not be picked as a support (a wasted heavy
    # call) when the real items are exhausted: rank r -> exactly r picks.
    rng = np.random.default_rng(0)
    r = 5
    R = rng.standard_normal((80, r)) @ rng.standard_normal((r, 60))
    R = np.hstack([R, np.full((80, 3), const)])
    with pytest.warns(UserWarning, match=f"stopped after {r} of 10"):
        S = select_support(R, 10, "greedy", center=True)
    assert len(S) == r and S.max() < 60


def test_greedy_centred_keeps_items_varying_little_around_a_large_offset():
    # a real rank-5 relevance on top of a huge common offset: the spread is 1e-13 of the
    # values, yet far above the rounding of centring, so all 5 directions must be found
    rng = np.random.default_rng(0)
    R = rng.standard_normal((10_000, 5)) @ rng.standard_normal((5, 40))
    S = select_support(1e9 + 1e-4 * R, 5, "greedy", center=True)
    assert len(S) == 5
    assert np.linalg.matrix_rank(R[:, S] - R[:, S].mean(0)) == 5


def test_greedy_selection_is_scale_and_permutation_equivariant():
    rng = np.random.default_rng(4)
    R = rng.standard_normal((25, 18))
    S = select_support(R, 6, "greedy")
    np.testing.assert_array_equal(select_support(7.5 * R, 6, "greedy"), S)
    perm = rng.permutation(18)
    np.testing.assert_array_equal(perm[select_support(R[:, perm], 6, "greedy")], S)
    qperm = rng.permutation(25)
    np.testing.assert_array_equal(select_support(R[qperm], 6, "greedy"), S)


def test_popular_picks_highest_mean_descending():
    rng = np.random.default_rng(5)
    R = rng.standard_normal((20, 50)) + np.linspace(-3, 3, 50)[rng.permutation(50)]
    S, scores = select_support(R, 5, "popular", return_scores=True)
    mean = R.mean(axis=0)
    assert S[0] == np.argmax(mean)  # not the ascending-sort bug
    np.testing.assert_array_equal(S, np.argsort(-mean, kind="stable")[:5])
    np.testing.assert_allclose(scores, mean[S])


def test_kmeans_returns_one_real_item_per_cluster():
    rng = np.random.default_rng(6)
    k = 5
    centres = 20.0 * rng.standard_normal((k, 12))
    labels = np.repeat(np.arange(k), [30, 10, 5, 3, 2])
    R = (centres[labels] + 0.1 * rng.standard_normal((len(labels), 12))).T  # (12, 50)
    S = select_support(R, k, "kmeans", center=False, random_state=0)
    assert len(set(S.tolist())) == k
    assert sorted(labels[S].tolist()) == list(range(k))
    # each pick is the member nearest its cluster mean
    for j in S:
        members = np.flatnonzero(labels == labels[j])
        centre = R.T[members].mean(axis=0)
        d = ((R.T[members] - centre) ** 2).sum(axis=1)
        assert d[members == j][0] <= d.min() + 1e-9  # (two-member clusters tie)


def test_kmeans_distinct_with_duplicated_items():
    R = np.repeat(np.random.default_rng(7).standard_normal((6, 3)), 4, axis=1)  # 12 items
    S = select_support(R, 6, "kmeans", random_state=0)
    assert len(set(S.tolist())) == 6


@pytest.mark.parametrize("center", [True, False])
def test_farthest_point_property(center):
    R = np.random.default_rng(8).standard_normal((10, 40))
    S, scores = select_support(R, 7, "farthest", center=center, return_scores=True)
    X = R.T - R.T.mean(axis=1, keepdims=True) if center else R.T
    assert S[0] == np.argmax(((X - X.mean(axis=0)) ** 2).sum(axis=1))
    for t in range(1, 7):
        dmin = cdist(X, X[S[:t]]).min(axis=1)
        assert S[t] == np.argmax(dmin)
        np.testing.assert_allclose(scores[t], dmin.max(), rtol=1e-9)


@pytest.mark.parametrize("R", [np.ones((5, 8)), np.zeros((4, 6)),
                               np.repeat(np.arange(3.0)[None], 4, axis=1)])
def test_farthest_distinct_when_items_coincide(R):
    # regression: once every remaining item coincided with a chosen one (all minimum
    # distances 0), argmax returned an already chosen item again (e.g. [0, 0, 0, 0])
    for center in (True, False):
        S, scores = select_support(R, 5, "farthest", center=center, return_scores=True)
        assert len(set(S.tolist())) == 5
        assert np.all(scores >= 0)


def test_random_is_seeded_and_distinct():
    R = np.zeros((3, 100))
    a = select_support(R, 30, "random", random_state=1)
    np.testing.assert_array_equal(a, select_support(R, 30, "random", random_state=1))
    assert len(set(a.tolist())) == 30
    assert not np.array_equal(a, select_support(R, 30, "random", random_state=2))


def test_select_support_bad_input():
    R = np.ones((4, 5))
    with pytest.raises(ValueError, match="k=6"):
        select_support(R, 6)
    with pytest.raises(ValueError, match="method must be one of"):
        select_support(R, 2, "nope")
    with pytest.raises(ValueError, match="NaN"):
        select_support(np.full((3, 3), np.nan), 1)
    with pytest.raises(ValueError, match="2D"):
        select_support(np.ones(5), 1)


def test_greedy_selection_tensor_api():
    X = torch.eye(4, dtype=torch.float64)
    idx, gains = greedy_selection(X, 4)
    assert sorted(idx.tolist()) == [0, 1, 2, 3]
    torch.testing.assert_close(gains, torch.ones(4, dtype=torch.float64))


# -- linear head ---------------------------------------------------------------------
def _t(a):
    return torch.as_tensor(a, dtype=torch.float64)


def test_linear_embeddings_match_lstsq_plain():
    rng = np.random.default_rng(9)
    R = rng.standard_normal((30, 20))
    S = [1, 4, 7, 9]
    out = fit_linear_embeddings(_t(R[:, S]), _t(R), standardize=False)
    ref, *_ = np.linalg.lstsq(R[:, S], R, rcond=None)
    np.testing.assert_allclose(out["embeddings"].numpy(), ref.T, atol=1e-10)
    np.testing.assert_allclose(out["offsets"].numpy(), 0.0)


def test_linear_embeddings_match_affine_lstsq_standardized():
    rng = np.random.default_rng(10)
    R = rng.standard_normal((30, 20)) + 3.0
    S = [0, 2, 5]
    out = fit_linear_embeddings(_t(R[:, S]), _t(R), standardize=True)
    A = np.hstack([R[:, S], np.ones((30, 1))])
    coef, *_ = np.linalg.lstsq(A, R, rcond=None)
    Rq = rng.standard_normal((5, 20)) + 3.0  # new queries
    pred = ((_t(Rq[:, S]) - out["mean"]) / out["scale"]) @ out["embeddings"].T + out["offsets"]
    np.testing.assert_allclose(pred.numpy(), np.hstack([Rq[:, S], np.ones((5, 1))]) @ coef,
                               atol=1e-10)


def test_linear_embeddings_ridge_closed_form():
    rng = np.random.default_rng(11)
    R = rng.standard_normal((25, 15))
    S = [3, 4, 8, 12]
    lam = 2.5
    out = fit_linear_embeddings(_t(R[:, S]), _t(R), ridge=lam, standardize=False)
    A = R[:, S]
    ref = np.linalg.solve(A.T @ A + lam * np.eye(4), A.T @ R)
    np.testing.assert_allclose(out["embeddings"].numpy(), ref.T, atol=1e-10)


def test_linear_predictions_invariant_to_invertible_mix_of_supports():
    rng = np.random.default_rng(12)
    R = rng.standard_normal((30, 20))
    S = [0, 3, 6, 9, 11]
    M = rng.standard_normal((5, 5)) + 3 * np.eye(5)
    Rq = rng.standard_normal((4, 20))
    a = fit_linear_embeddings(_t(R[:, S]), _t(R), standardize=False)
    b = fit_linear_embeddings(_t(R[:, S] @ M), _t(R), standardize=False)
    np.testing.assert_allclose((_t(Rq[:, S]) @ a["embeddings"].T).numpy(),
                               (_t(Rq[:, S] @ M) @ b["embeddings"].T).numpy(), atol=1e-9)


def test_exact_recovery_of_low_rank_relevance_for_heldout_queries():
    rng = np.random.default_rng(13)
    r = 5
    A, B = rng.standard_normal((80, r)), rng.standard_normal((60, r))
    R = A @ B.T
    with pytest.warns(UserWarning):
        S = select_support(R[:50], 12, "greedy", center=False)
    assert len(S) == r
    out = fit_linear_embeddings(_t(R[:50, S]), _t(R[:50]), standardize=False)
    pred = _t(R[50:, S]) @ out["embeddings"].T
    np.testing.assert_allclose(pred.numpy(), R[50:], atol=1e-8)


# -- metrics and loss ---------------------------------------------------------------
def test_hit_rate_reference():
    true = np.array([[0.1, 0.9, 0.5, 0.3], [4.0, 3.0, 2.0, 1.0]])
    assert hit_rate(true, [[1, 2], [0, 1]]) == 1.0
    assert hit_rate(true, [[1, 0], [3, 2]]) == 0.25
    assert hit_rate(true, [[1, 0, 2], [0, 3, 2]], k=1) == 1.0
    with pytest.raises(ValueError, match="k must be"):
        hit_rate(true, [[1, 0], [0, 1]], k=3)


def test_softmax_signed_loss_hand_computed():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    targets = torch.tensor([[0.0, 0.1, 0.2, 5.0]])
    p = torch.softmax(logits, dim=1)[0]
    expected = -(p[3] - p[0] - p[1] - p[2]) / 4
    torch.testing.assert_close(softmax_signed_loss(logits, targets, 0.99), expected)
    # the threshold is torch.quantile's (linear interpolation)
    t = torch.randn(6, 37, generator=torch.Generator().manual_seed(0))
    lg = torch.randn(6, 37, generator=torch.Generator().manual_seed(1))
    for q in (0.5, 0.9, 0.99):
        sign = torch.where(t >= torch.quantile(t, q, dim=1, keepdim=True), 1.0, -1.0)
        torch.testing.assert_close(softmax_signed_loss(lg, t, q),
                                   -(sign * torch.softmax(lg, dim=1)).mean())
    # gradient pushes the positive's logit up
    logits.requires_grad_(True)
    softmax_signed_loss(logits, targets, 0.99).backward()
    assert logits.grad[0, 3] < 0 and torch.all(logits.grad[0, :3] > 0)
