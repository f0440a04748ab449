"""Exactness of the union ("shared") matching kernel, the kernel choice and the image ordering."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.anomaly.rad import RADDetector
from mlpapers.anomaly.rad._kernels import (
    l2_normalize,
    neighbour_indices,
    positional_patch_similarity,
    tiled_patch_similarity,
)
from mlpapers.anomaly.rad._matching import (
    choose_matching,
    order_by_neighbours,
    positional_similarity,
    shared_patch_similarity,
)
from mlpapers.datasets import make_texture_anomalies


def _brute_force(query, memory, nbrs, h, w, r):
    """Float64 max over every (retrieved image, grid cell) pair inside the window."""
    q, m = query.double(), memory.double()
    sim = torch.einsum("blc,nmc->blnm", q, m)  # (B, L, N, L)
    ys, xs = torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)
    window = ((ys[:, None] - ys[None, :]).abs() <= r) & ((xs[:, None] - xs[None, :]).abs() <= r)
    retrieved = torch.zeros(len(q), len(m), dtype=torch.bool)
    retrieved[torch.arange(len(q))[:, None], nbrs] = True
    valid = retrieved[:, None, :, None] & window[None, :, None, :]
    return sim.masked_fill(~valid, -torch.inf).amax(dim=(2, 3))


def _problem(seed, B, N, h, w, C, k, sets="random"):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(B, h * w, C, generator=g))
    m = l2_normalize(torch.randn(N, h * w, C, generator=g))
    if sets == "identical":
        nbrs = torch.randperm(N, generator=g)[:k].expand(B, k)
    elif sets == "disjoint":
        nbrs = torch.randperm(N, generator=g)[:B * k].reshape(B, k)
    else:
        nbrs = torch.stack([torch.randperm(N, generator=g)[:k] for _ in range(B)])
    return q, m, nbrs


@pytest.mark.parametrize("h, w", [(1, 1), (3, 5), (6, 2), (4, 4)])
@pytest.mark.parametrize("r", [0, 1, 2, 7])
@pytest.mark.parametrize("k, sets", [(1, "random"), (3, "random"), (3, "identical"),
                                     (2, "disjoint"), (9, "random")])
def test_shared_equals_brute_force(h, w, r, k, sets):
    q, m, nbrs = _problem(h * 100 + w * 10 + r + k, B=4, N=9, h=h, w=w, C=5, k=k, sets=sets)
    want = _brute_force(q, m, nbrs, h, w, r).float()
    for chunk in (2**22, 1):  # 1: one union image and one position per chunk
        got = shared_patch_similarity(q, m, nbrs, (h, w), r, chunk_size=chunk)
        assert got.shape == (4, h * w) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), B=st.integers(1, 6), h=st.integers(1, 7),
       w=st.integers(1, 7), C=st.integers(1, 20), r=st.integers(0, 4), k=st.integers(1, 8),
       chunk=st.sampled_from([7, 300, 5000, 2**22]), block=st.sampled_from([1, 64, 2**18]),
       memory_block=st.sampled_from([1, 1000, 2**20]))
def test_shared_equals_gather_kernel(seed, B, h, w, C, r, k, chunk, block, memory_block):
    q, m, nbrs = _problem(seed, B=B, N=8, h=h, w=w, C=C, k=k)
    index, mask = neighbour_indices(h, w, r)
    want = positional_patch_similarity(q, m, nbrs, index, mask)
    got = shared_patch_similarity(q, m, nbrs, (h, w), r, chunk_size=chunk, block_size=block,
                                  memory_block=memory_block)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_half_precision_memory_and_duplicate_neighbours():
    q, m, nbrs = _problem(0, B=5, N=12, h=5, w=6, C=16, k=4)
    m16 = m.half()
    index, mask = neighbour_indices(5, 6, 1)
    want = positional_patch_similarity(q, m16.float(), nbrs, index, mask)
    torch.testing.assert_close(shared_patch_similarity(q, m16, nbrs, (5, 6), 1), want,
                               atol=1e-6, rtol=0)
    dup = torch.cat([nbrs, nbrs[:, :2]], dim=1)  # repeated retrievals change nothing
    torch.testing.assert_close(shared_patch_similarity(q, m16, dup, (5, 6), 1), want,
                               atol=1e-6, rtol=0)


def test_all_kernels_agree_through_the_dispatcher():
    q, m, nbrs = _problem(1, B=6, N=20, h=9, w=7, C=24, k=5)
    outs = {name: positional_similarity(q, m, nbrs, (9, 7), 2, matching=name)
            for name in ("auto", "shared", "tiled", "gather")}
    for out in outs.values():
        torch.testing.assert_close(out, outs["gather"], atol=1e-6, rtol=0)
    torch.testing.assert_close(outs["tiled"], tiled_patch_similarity(q, m, nbrs, (9, 7), 2))
    with pytest.raises(ValueError, match="matching"):
        positional_similarity(q, m, nbrs, (9, 7), 2, matching="loop")


def test_choose_matching_cost_rule():
    same = torch.arange(10).expand(8, 10)
    assert choose_matching(same, (28, 28), 1) == "shared"
    overlap = torch.arange(7 * 50).reshape(7, 50)  # |U| = 7 k: 4 * 9 * 350 <= 7 * 50 * 36
    assert choose_matching(overlap, (28, 28), 1) == "shared"
    disjoint = torch.arange(8 * 50).reshape(8, 50)  # |U| = 8 k
    assert choose_matching(disjoint, (28, 28), 1) == "tiled"
    # a radius beyond the grid costs only the offsets that stay inside it
    assert choose_matching(torch.arange(40).reshape(2, 20), (2, 2), 50) == "shared"


def test_order_by_neighbours_groups_sets_and_is_a_permutation():
    g = torch.Generator().manual_seed(0)
    nbrs = torch.randint(0, 6, (40, 3), generator=g)
    order = order_by_neighbours(nbrs)
    assert sorted(order.tolist()) == list(range(40))
    first = nbrs[order, 0]
    assert torch.all(first[1:] >= first[:-1])  # grouped by the nearest retrieved image
    same_first = nbrs[order][first == first[0]]
    assert torch.all(same_first[1:, 1] >= same_first[:-1, 1])  # then by the second
    assert torch.equal(nbrs[order][torch.argsort(order)], nbrs)
    assert order_by_neighbours(nbrs[:, :1]).shape == (40,)


@pytest.fixture(scope="module")
def textures():
    return make_texture_anomalies(n_train=16, n_test=10, image_size=32, random_state=0)


def test_estimator_scores_equal_across_matchings_and_orders(textures):
    X_train, X_test, _, _ = textures
    perm = np.random.default_rng(0).permutation(len(X_test))
    ref = None
    for matching in ("gather", "tiled", "shared", "auto"):
        det = RADDetector(extractor="random", image_size=None, k_images=5, batch_size=3,
                          matching=matching).fit(X_train)
        maps, scores = det.anomaly_map(X_test, return_scores=True)
        maps_p, scores_p = det.anomaly_map(X_test[perm], return_scores=True)
        np.testing.assert_allclose(scores_p, scores[perm], atol=1e-6)
        np.testing.assert_allclose(maps_p, maps[perm], atol=1e-6)
        if ref is None:  # one image per call: no reordering at all
            single = np.concatenate([det.decision_function(X_test[i:i + 1])
                                     for i in range(len(X_test))])
            np.testing.assert_allclose(scores, single, atol=1e-6)
            ref = (scores, maps, det.decision_scores_)
        np.testing.assert_allclose(scores, ref[0], atol=1e-6)
        np.testing.assert_allclose(maps, ref[1], atol=1e-6)
        np.testing.assert_allclose(det.decision_scores_, ref[2], atol=1e-6)
    # batch size (hence the matching chunks) does not change the scores either
    det = RADDetector(extractor="random", image_size=None, k_images=5, batch_size=16).fit(X_train)
    np.testing.assert_allclose(det.decision_function(X_test), ref[0], atol=1e-6)
    np.testing.assert_allclose(det.decision_scores_, ref[2], atol=1e-6)


@pytest.mark.parametrize("memory_dtype, pos_radius", [("float16", 1), ("float32", 0),
                                                      ("float32", 17)])
def test_estimator_kernels_agree_with_half_memory_and_any_radius(textures, memory_dtype,
                                                                 pos_radius):
    # grids are 16x16 and 8x8: radius 17 covers both whole grids
    X_train, X_test, _, _ = textures
    out = {}
    for matching in ("tiled", "shared", "auto"):
        det = RADDetector(extractor="random", image_size=None, k_images=8, batch_size=4,
                          memory_dtype=memory_dtype, pos_radius=pos_radius,
                          matching=matching).fit(X_train)
        out[matching] = det.decision_function(X_test)
    np.testing.assert_allclose(out["shared"], out["tiled"], atol=1e-6)
    np.testing.assert_allclose(out["auto"], out["tiled"], atol=1e-6)
    if pos_radius == 17:  # a window covering the grid is global matching
        det = RADDetector(extractor="random", image_size=None, k_images=8,
                          pos_radius=None).fit(X_train)
        np.testing.assert_allclose(out["shared"], det.decision_function(X_test), atol=1e-6)
