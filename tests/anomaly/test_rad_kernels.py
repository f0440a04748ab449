"""Exact tests of the RAD / PatchCore kernels against brute-force references."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mlpapers.anomaly.rad import RandomConvExtractor
from mlpapers.anomaly.rad._kernels import (
    gaussian_blur,
    global_patch_similarity,
    greedy_coreset,
    knn_distances,
    l2_normalize,
    neighbour_indices,
    positional_patch_similarity,
    retrieve_neighbours,
    tiled_patch_similarity,
    top_ratio_pool,
)
from mlpapers.anomaly.rad._maps import (
    _gaussian_taps,
    _top_count,
    _top_values,
    fused_smoothed_maps,
    resize_maps,
    smoothing_operator,
)


def _loop_reference(query, memory, nbrs, h, w, radius):
    """Straightforward per-position loop (the official code's structure)."""
    B, L, _ = query.shape
    out = torch.empty(B, L, dtype=torch.float64)
    for b in range(B):
        for j in range(L):
            y, x = divmod(j, w)
            best = -np.inf
            for n in nbrs[b].tolist():
                for yy in range(h):
                    for xx in range(w):
                        if radius is not None and (abs(yy - y) > radius or abs(xx - x) > radius):
                            continue
                        best = max(best, float(query[b, j].double() @ memory[n, yy * w + xx]
                                               .double()))
            out[b, j] = best
    return out


def _random_problem(seed, B, N, h, w, C, k):
    g = torch.Generator().manual_seed(seed)
    q = l2_normalize(torch.randn(B, h * w, C, generator=g))
    m = l2_normalize(torch.randn(N, h * w, C, generator=g))
    nbrs = torch.stack([torch.randperm(N, generator=g)[:k] for _ in range(B)])
    return q, m, nbrs


@settings(max_examples=25, deadline=None)
@given(h=st.integers(1, 5), w=st.integers(1, 5), r=st.integers(0, 3))
def test_neighbour_indices_match_window(h, w, r):
    index, mask = neighbour_indices(h, w, r)
    # the window is clipped per axis to the offsets that can stay inside the grid
    ry, rx = min(r, h - 1), min(r, w - 1)
    assert index.shape == mask.shape == (h * w, (2 * ry + 1) * (2 * rx + 1))
    for j in range(h * w):
        y, x = divmod(j, w)
        want = {yy * w + xx for yy in range(h) for xx in range(w)
                if abs(yy - y) <= r and abs(xx - x) <= r}
        got = index[j][mask[j]].tolist()
        assert sorted(got) == sorted(want)  # each cell once, none outside
        assert (index[j][~mask[j]] == j).all()  # padding is the position itself


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), h=st.integers(1, 4), w=st.integers(1, 4),
       r=st.one_of(st.none(), st.integers(0, 2)), k=st.integers(1, 3),
       chunk=st.sampled_from([1, 50, 2**20]))
def test_positional_matching_equals_loop_reference(seed, h, w, r, k, chunk):
    q, m, nbrs = _random_problem(seed, B=2, N=4, h=h, w=w, C=5, k=k)
    ref = _loop_reference(q, m, nbrs, h, w, r)
    if r is None:
        got = global_patch_similarity(q, m, nbrs, chunk_size=chunk)
    else:
        index, mask = neighbour_indices(h, w, r)
        got = positional_patch_similarity(q, m, nbrs, index, mask, chunk_size=chunk)
        for tile in (1, 2, 3, 4, 8):
            tiled = tiled_patch_similarity(q, m, nbrs, (h, w), r, tile=tile, chunk_size=chunk)
            torch.testing.assert_close(tiled.double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)


def test_global_equals_full_window_and_brute_force_nn():
    q, m, nbrs = _random_problem(1, B=3, N=6, h=4, w=5, C=8, k=6)
    glob = global_patch_similarity(q, m, nbrs)
    index, mask = neighbour_indices(4, 5, None)
    full = positional_patch_similarity(q, m, nbrs, index, mask)
    big = positional_patch_similarity(q, m, nbrs, *neighbour_indices(4, 5, 10))
    brute = (q @ m.reshape(-1, 8).T).amax(dim=2)  # every memory patch (k = N)
    torch.testing.assert_close(glob, brute)
    torch.testing.assert_close(full, brute)
    torch.testing.assert_close(big, brute)


def test_radius_zero_is_same_position_matching():
    q, m, nbrs = _random_problem(2, B=2, N=5, h=3, w=4, C=6, k=3)
    got = positional_patch_similarity(q, m, nbrs, *neighbour_indices(3, 4, 0))
    same = torch.einsum("blc,bklc->bkl", q, m[nbrs]).amax(dim=1)
    torch.testing.assert_close(got, same)
    torch.testing.assert_close(tiled_patch_similarity(q, m, nbrs, (3, 4), 0), same)


def test_tiled_equals_gather_on_a_larger_grid():
    q, m, nbrs = _random_problem(5, B=3, N=7, h=13, w=10, C=6, k=4)
    for r in (1, 2, 20):
        gathered = positional_patch_similarity(q, m, nbrs, *neighbour_indices(13, 10, r))
        torch.testing.assert_close(tiled_patch_similarity(q, m, nbrs, (13, 10), r), gathered)
        torch.testing.assert_close(
            tiled_patch_similarity(q, m.half(), nbrs, (13, 10), r, tile=4, chunk_size=1),
            positional_patch_similarity(q, m.half(), nbrs, *neighbour_indices(13, 10, r)))


def test_tiled_masks_cells_outside_the_grid():
    # cells of a tile's candidate block that fall outside the grid read memory row 0
    # in the gather; they must never win. Make row 0 the perfect match of every query.
    h, w, C = 7, 6, 3
    q = torch.zeros(2, h * w, C)
    q[..., 0] = 1.0
    m = -q[:1].repeat(3, 1, 1)
    m[:, 0] = q[0, 0]  # only position 0 matches (cosine 1); everything else is -1
    nbrs = torch.tensor([[0, 1], [2, 1]])
    for r in (0, 1, 2):
        want = positional_patch_similarity(q, m, nbrs, *neighbour_indices(h, w, r))
        for tile in (2, 3, 4, 5):
            got = tiled_patch_similarity(q, m, nbrs, (h, w), r, tile=tile)
            torch.testing.assert_close(got, want)
        near = torch.tensor([max(divmod(j, w)) <= r for j in range(h * w)])
        assert (want[:, near] == 1).all() and (want[:, ~near] == -1).all()


def test_half_precision_memory_is_close():
    q, m, nbrs = _random_problem(3, B=2, N=5, h=4, w=4, C=16, k=3)
    idx = neighbour_indices(4, 4, 1)
    full = positional_patch_similarity(q, m, nbrs, *idx)
    half = positional_patch_similarity(q, m.half(), nbrs, *idx)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, full, atol=2e-3, rtol=0)


def test_retrieve_neighbours_clamps_and_excludes():
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(5, 4, generator=g)
    q = torch.randn(3, 4, generator=g)
    nb = retrieve_neighbours(q, keys, k=100)
    assert nb.shape == (3, 5)  # k clamped to N
    cos = l2_normalize(q) @ l2_normalize(keys).T
    assert torch.equal(nb, torch.argsort(cos, dim=1, descending=True))
    self_nb = retrieve_neighbours(keys, keys, k=1)
    assert torch.equal(self_nb[:, 0], torch.arange(5))  # an image retrieves itself
    loo = retrieve_neighbours(keys, keys, k=100, exclude=torch.arange(5))
    assert loo.shape == (5, 4)
    assert not (loo == torch.arange(5)[:, None]).any()


def test_top_ratio_pool():
    maps = torch.arange(200, dtype=torch.float32).reshape(2, 10, 10)
    torch.testing.assert_close(top_ratio_pool(maps, 0.0), torch.tensor([99.0, 199.0]))
    torch.testing.assert_close(top_ratio_pool(maps, 0.05), torch.tensor([97.0, 197.0]))
    torch.testing.assert_close(top_ratio_pool(maps, 1.0), maps.reshape(2, -1).mean(1))
    tiny = torch.rand(3, 2, 2)  # 1% of 4 pixels -> still one pixel (no NaN)
    torch.testing.assert_close(top_ratio_pool(tiny, 0.01), tiny.reshape(3, -1).amax(1))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n_pixels=st.integers(1, 3000), ratio=st.floats(0.0, 1.0),
       levels=st.sampled_from([None, 2, 5]))
def test_top_values_prefilter_equals_topk(seed, n_pixels, ratio, levels):
    # the block-max prefilter of the image score keeps exactly the multiset of the n
    # largest values, ties included (levels: maps of a few repeated values)
    g = torch.Generator().manual_seed(seed)
    maps = torch.rand(3, n_pixels, generator=g)
    if levels is not None:
        maps = torch.floor(maps * levels)
    n = _top_count(n_pixels, ratio)
    expected = torch.topk(maps, n, dim=1).values
    got = torch.sort(_top_values(maps, n, block=4), dim=1, descending=True).values
    assert torch.equal(got, expected)
    # the pooled score is their mean, to float rounding
    torch.testing.assert_close(top_ratio_pool(maps, ratio), expected.mean(dim=1))


def test_gaussian_blur_matches_2d_conv_with_zero_padding():
    x = torch.rand(2, 9, 11)
    got = gaussian_blur(x, 1.0)
    t = torch.arange(5.0) - 2
    g = torch.exp(-0.5 * t**2)
    k2 = torch.outer(g, g) / g.sum() ** 2
    ref = F.conv2d(x[:, None], k2[None, None], padding=2)[:, 0]
    torch.testing.assert_close(got, ref)
    assert gaussian_blur(x, 0.0) is x
    const = torch.ones(1, 8, 8)
    torch.testing.assert_close(gaussian_blur(const, 1.0, padding="reflect"), const)
    assert gaussian_blur(const, 1.0)[0, 0, 0] < 1.0  # zero padding darkens borders
    big = torch.rand(3, 20, 17)
    ref = F.conv2d(F.pad(big[:, None], (2, 2, 2, 2), mode="reflect"), k2[None, None])[:, 0]
    torch.testing.assert_close(gaussian_blur(big, 1.0, padding="reflect"), ref)


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (2, 7), (3, 2), (4, 9)])
@pytest.mark.parametrize("sigma", [1.0, 2.5])
def test_reflect_blur_on_maps_thinner_than_the_kernel(shape, sigma):
    # maps with a side shorter than the kernel's half width are mirrored again (as numpy
    # pads), not padded with zeros past one reflection: constant maps stay constant
    const = torch.full((2, *shape), 3.0, dtype=torch.float64)
    torch.testing.assert_close(gaussian_blur(const, sigma, padding="reflect"), const)
    x = torch.rand(2, *shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    g = _gaussian_taps(sigma, None)
    half = len(g) // 2
    padded = torch.from_numpy(np.pad(x.numpy(), ((0, 0), (half, half), (half, half)),
                                     mode="reflect"))
    ref = F.conv2d(padded[:, None], torch.outer(g, g)[None, None])[:, 0]
    torch.testing.assert_close(gaussian_blur(x, sigma, padding="reflect"), ref)
    op = smoothing_operator(shape[1], shape[1], sigma, "reflect")
    torch.testing.assert_close(op.sum(1), torch.ones(shape[1], dtype=torch.float64))


@pytest.mark.parametrize("padding", ["zeros", "reflect"])
@pytest.mark.parametrize("sigma", [0.0, 0.4, 1.0, 2.5])
@pytest.mark.parametrize("grid,size", [((28, 28), (224, 224)), ((5, 3), (37, 19)),
                                       ((1, 7), (2, 9)), ((16, 16), (16, 16)),
                                       ((6, 4), (3, 3)), ((1, 1), (1, 1))])
def test_fused_smoothed_maps_equals_resize_fuse_then_blur(grid, size, sigma, padding):
    # the per-axis matrices compose bilinear resizing (up or down) and the blur exactly,
    # for both paddings, kernels wider than the map and one-pixel axes
    g = torch.Generator().manual_seed(0)
    (h, w), half = grid, (max(1, grid[0] // 2), max(1, grid[1] // 2))
    a, b = torch.rand(3, h, w, generator=g), torch.rand(3, *half, generator=g)
    ref = gaussian_blur(0.3 * resize_maps(a, size) + 0.7 * resize_maps(b, size), sigma,
                        padding=padding)
    got = fused_smoothed_maps([a, b], [0.3, 0.7], size, sigma, padding)
    torch.testing.assert_close(got, ref, rtol=0, atol=2e-6)
    one = fused_smoothed_maps([a.double()], [1.0], size, sigma, padding)
    torch.testing.assert_close(one, gaussian_blur(resize_maps(a.double(), size), sigma,
                                                  padding=padding))


def test_smoothing_operator_identity_and_exact_zeros():
    torch.testing.assert_close(smoothing_operator(9, 9, 0.0), torch.eye(9, dtype=torch.float64))
    # rows of the resize-and-blur operator with reflect padding sum to one (constant maps
    # stay constant); zero maps stay exactly zero (training images score 0)
    A = smoothing_operator(7, 40, 1.0, "reflect")
    torch.testing.assert_close(A.sum(1), torch.ones(40, dtype=torch.float64))
    assert (fused_smoothed_maps([torch.zeros(2, 7, 7)], [1.0], (40, 40), 1.0) == 0).all()


def test_knn_distances_against_cdist_and_exclusion():
    g = torch.Generator().manual_seed(0)
    q, m = torch.randn(50, 7, generator=g), torch.randn(40, 7, generator=g)
    ref = torch.cdist(q.double(), m.double()).sort(dim=1).values[:, :3]
    for chunk in (1, 37, 2**24):
        torch.testing.assert_close(knn_distances(q, m, k=3, chunk_size=chunk).double(), ref,
                                   atol=1e-4, rtol=1e-4)
    qg, mg = torch.arange(50) % 4, torch.arange(40) % 4
    d = torch.cdist(q, m).masked_fill(qg[:, None] == mg[None], torch.inf).amin(1)
    got = knn_distances(q, m, k=1, chunk_size=13, exclude_query_group=qg, memory_group=mg)
    torch.testing.assert_close(got[:, 0], d, atol=1e-4, rtol=1e-4)


def test_greedy_coreset_equals_reference():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 5, generator=g, dtype=torch.float64)
    sel = greedy_coreset(x, 10, generator=torch.Generator().manual_seed(3), projection_dim=None)
    first = int(torch.randint(60, (1,), generator=torch.Generator().manual_seed(3)))
    ref = [first]
    d = ((x - x[first]) ** 2).sum(1)
    for _ in range(9):
        ref.append(int(torch.argmax(d)))
        d = torch.minimum(d, ((x - x[ref[-1]]) ** 2).sum(1))
    assert sel.tolist() == ref
    assert len(set(greedy_coreset(x, 60, projection_dim=None).tolist())) == 60
    assert len(greedy_coreset(x, 500)) == 60  # clamped


def test_greedy_coreset_assignment_is_the_nearest_selected_row():
    x = torch.randn(80, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sel, cover = greedy_coreset(x, 12, generator=torch.Generator().manual_seed(2),
                                projection_dim=None, return_assignment=True)
    assert torch.equal(sel, greedy_coreset(x, 12, generator=torch.Generator().manual_seed(2),
                                           projection_dim=None))
    d = torch.cdist(x, x[sel])
    torch.testing.assert_close(d.gather(1, cover[:, None])[:, 0], d.amin(1))
    assert torch.equal(cover[sel], torch.arange(12))  # a selected row covers itself


def test_greedy_coreset_covering_radius_beats_random():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 3, generator=g)
    sel = greedy_coreset(x, 40, generator=g)
    rnd = torch.randperm(400, generator=g)[:40]
    radius = lambda s: torch.cdist(x, x[s]).amin(1).max()  # noqa: E731
    assert radius(sel) < radius(rnd)


def test_random_conv_extractor_is_deterministic():
    x = torch.rand(2, 3, 16, 20, generator=torch.Generator().manual_seed(0))
    state = torch.get_rng_state()
    f1, k1 = RandomConvExtractor(seed=0)(x)
    f2, k2 = RandomConvExtractor(seed=0)(x)
    f3, _ = RandomConvExtractor(seed=1)(x)
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    assert all(torch.equal(a, b) for a, b in zip(f1, f2)) and torch.equal(k1, k2)
    assert not torch.allclose(f1[0], f3[0])
    assert [tuple(f.shape) for f in f1] == [(2, 32, 8, 10), (2, 64, 4, 5)]
    assert k1.shape == (2, 128)


def test_retrieved_indices_own_only_their_k_columns():
    # the result used to be a view of the (B, N) int64 sort: callers keep every batch's
    # result, so RAD's fit held n_train**2 indices (+593 MB peak at 8000 images)
    g = torch.Generator().manual_seed(0)
    got = retrieve_neighbours(torch.randn(8, 16, generator=g), torch.randn(500, 16, generator=g),
                              10)
    assert got.shape == (8, 10)
    assert got.untyped_storage().nbytes() == got.numel() * got.element_size()
