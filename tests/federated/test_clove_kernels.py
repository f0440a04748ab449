"""Exact properties of the assignment rules and the batched client kernels."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mlpapers.federated.clove import choose_n_clusters, clove_assign, ifca_assign
from mlpapers.federated.clove._kernels import (
    batched_adam_step,
    batched_loss_matrix,
    match_clusters,
    random_assignment,
    weighted_model_average,
)
from mlpapers.federated.clove._models import make_sample_loss_fn, per_sample_loss

finite = st.floats(0.0, 10.0, allow_nan=False, width=32)


def _brute_force_matching_cost(cost: np.ndarray) -> float:
    """Minimum of ``sum_c cost[c, pi(c)]`` over injective ``pi`` (small K)."""
    k, m = cost.shape
    return min(
        float(cost[np.arange(k), list(p)].sum()) for p in itertools.permutations(range(m), k)
    )


def _blobs(K, per, rng, spread=0.01):
    """Loss matrix whose cluster k has its smallest loss on a random model perm[k]."""
    perm = rng.permutation(K)
    centers = 1.0 + rng.random((K, K))
    centers[np.arange(K), perm] = 0.0
    truth = np.repeat(np.arange(K), per)
    L = centers[truth] + spread * rng.random((K * per, K))
    return L, truth, perm


@settings(max_examples=25, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(3, 9), st.integers(1, 4)), elements=finite),
       st.integers(0, 2**16))
def test_clove_assign_is_client_order_invariant(L, seed):
    k = min(L.shape[1], L.shape[0])
    perm = np.random.default_rng(seed).permutation(L.shape[0])
    a = clove_assign(L, k, random_state=0)
    b = clove_assign(L[perm], k, random_state=0)
    np.testing.assert_array_equal(a[perm], b)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.integers(1, 12), st.integers(0, 2**16))
def test_matching_matches_brute_force(k, extra, n, seed):
    rng = np.random.default_rng(seed)
    m = k + extra
    L = rng.random((n, m))
    labels = rng.integers(0, k, n)
    perm = match_clusters(L, labels, k)
    assert len(set(perm.tolist())) == k  # injective
    cost = np.zeros((k, m))
    np.add.at(cost, labels, L)
    assert cost[np.arange(k), perm].sum() == pytest.approx(_brute_force_matching_cost(cost))


def test_brute_force_helper_on_a_known_case():
    cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]])
    best = min(sum(cost[i, p[i]] for i in range(3)) for p in itertools.permutations(range(3)))
    assert _brute_force_matching_cost(cost) == best == 5.0


@pytest.mark.parametrize("K", [2, 3, 5])
def test_clove_assign_recovers_blobs_and_picks_min_loss_models(K):
    rng = np.random.default_rng(K)
    L, truth, perm = _blobs(K, 4, rng)
    a = clove_assign(L, K, random_state=0)
    np.testing.assert_array_equal(a, perm[truth])  # each cluster gets its min-loss model


def test_clove_assign_is_equivariant_to_model_permutation():
    rng = np.random.default_rng(0)
    L, truth, _ = _blobs(4, 5, rng)
    sigma = rng.permutation(4)
    a = clove_assign(L, 4, random_state=0)
    b = clove_assign(L[:, sigma], 4, random_state=0)
    np.testing.assert_array_equal(sigma[b], a)


def test_clove_assign_with_fewer_clusters_than_models_and_centers():
    rng = np.random.default_rng(1)
    L, truth, perm = _blobs(4, 3, rng)
    a, centers = clove_assign(L, 2, random_state=0, return_centers=True)
    assert len(np.unique(a)) == 2
    used = np.unique(a)
    assert np.isfinite(centers[used]).all()
    assert np.isnan(np.delete(centers, used, axis=0)).all()
    for j in used:  # centers are the means of their clients' loss vectors
        np.testing.assert_allclose(centers[j], L[a == j].mean(0), atol=1e-8)


def test_identical_loss_vectors_do_not_crash():
    L = np.ones((6, 3))
    a = clove_assign(L, 3, random_state=0)
    assert len(np.unique(a)) == 1
    L2 = np.vstack([np.ones((3, 3)), 2 * np.ones((3, 3))])
    a2 = clove_assign(L2, 3, random_state=0)
    assert len(np.unique(a2)) == 2 and a2[0] == a2[2] and a2[3] == a2[5]


def test_clove_assign_bad_input():
    with pytest.raises(ValueError, match="2D"):
        clove_assign(np.ones(3), 1)
    with pytest.raises(ValueError, match="NaN"):
        clove_assign(np.array([[np.nan, 1.0]]), 1)
    with pytest.raises(ValueError, match="n_clusters"):
        clove_assign(np.ones((4, 2)), 3)
    with pytest.raises(ValueError, match="clients"):
        clove_assign(np.random.rand(2, 3), 3)


def test_ifca_assign_is_argmin():
    L = np.array([[1.0, 0.5, 2.0], [0.1, 0.2, 0.3], [3.0, 3.0, 1.0]])
    np.testing.assert_array_equal(ifca_assign(L), [1, 0, 2])


def test_choose_n_clusters_finds_the_number_of_blobs():
    rng = np.random.default_rng(0)
    L, _, _ = _blobs(3, 6, rng)
    L = np.hstack([L, 1.5 + 0.01 * rng.random((18, 4))])  # 7 models, 3 groups
    assert choose_n_clusters(L, 7) == 3
    assert choose_n_clusters(np.ones((5, 3)), 3) == 1


def test_random_assignment_uses_every_model():
    rng = np.random.default_rng(0)
    for n, k in [(3, 3), (10, 4), (50, 7)]:
        a = random_assignment(n, k, rng)
        assert sorted(set(a.tolist())) == list(range(k)) and len(a) == n
    with pytest.raises(ValueError):
        random_assignment(2, 3, rng)


def test_weighted_model_average_exact_and_empty_model_unchanged():
    old = {"w": torch.tensor([[1.0, 1.0], [5.0, 5.0], [7.0, 7.0]])}
    client = {"w": torch.tensor([[0.0, 2.0], [4.0, 2.0], [9.0, 9.0]])}
    a = torch.tensor([0, 0, 2])
    n = torch.tensor([1.0, 3.0, 2.0])
    new = weighted_model_average(client, a, n, old)
    torch.testing.assert_close(new["w"][0], torch.tensor([3.0, 2.0]))
    torch.testing.assert_close(new["w"][1], old["w"][1])
    torch.testing.assert_close(new["w"][2], torch.tensor([9.0, 9.0]))


def test_batched_adam_matches_torch_adam():
    torch.manual_seed(0)
    n, d = 4, 3
    p0 = torch.randn(n, d)
    grads = [torch.randn(n, d) for _ in range(5)]
    active = [torch.tensor([True, True, False, True])] * 2 + [torch.ones(n, dtype=bool)] * 3
    P = {"w": p0.clone()}
    m1, m2 = {"w": torch.zeros(n, d)}, {"w": torch.zeros(n, d)}
    count = torch.zeros(n, dtype=torch.long)
    for g, act in zip(grads, active):
        # as the engine does: gather the clients with a batch left, step, scatter back
        at = act.nonzero().squeeze(1)
        sub = [{"w": t["w"][at]} for t in (P, m1, m2)]
        count[at] += 1
        batched_adam_step(*sub[:1], {"w": g[at]}, *sub[1:], count[at], lr=0.1)
        for t, u in zip((P, m1, m2), sub):
            t["w"][at] = u["w"]
    for i in range(n):
        w = torch.nn.Parameter(p0[i].clone())
        opt = torch.optim.Adam([w], lr=0.1)
        for g, act in zip(grads, active):
            if act[i]:
                w.grad = g[i].clone()
                opt.step()
        torch.testing.assert_close(P["w"][i], w.detach(), rtol=1e-5, atol=1e-6)


def test_batched_loss_matrix_matches_a_loop_and_chunks():
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    K, n = 3, 5
    params = {"weight": torch.randn(K, 2, 3), "bias": torch.randn(K, 2)}
    sizes = torch.tensor([7, 3, 5, 1, 6])
    X, Y = torch.randn(int(sizes.sum()), 3), torch.randn(int(sizes.sum()), 2)
    starts = torch.cumsum(sizes, 0) - sizes
    fn = make_sample_loss_fn(module, "mse")
    full = batched_loss_matrix(fn, params, X, Y, sizes)
    tiny = batched_loss_matrix(fn, params, X, Y, sizes, max_elements=1)
    torch.testing.assert_close(full, tiny)
    for i in range(n):
        for j in range(K):
            x, y = X[starts[i]:starts[i] + sizes[i]], Y[starts[i]:starts[i] + sizes[i]]
            out = x @ params["weight"][j].T + params["bias"][j]
            ref = per_sample_loss(out, x, y, "mse").mean()
            torch.testing.assert_close(full[i, j], ref)
