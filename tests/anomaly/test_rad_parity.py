"""Parity between RAD / PatchCore code paths that claim to agree (not compared elsewhere).

Each test names its two paths in the docstring.
"""

import copy

import numpy as np
import pytest
import torch

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector
from mlpapers.anomaly.rad._kernels import global_patch_similarity, l2_normalize
from mlpapers.anomaly.rad._matching import positional_similarity
from mlpapers.datasets import make_texture_anomalies

MATCHINGS = ("auto", "shared", "tiled", "gather")


@pytest.fixture(scope="module")
def textures():
    X_train, X_test, _, _ = make_texture_anomalies(n_train=7, n_test=4, image_size=27,
                                                   random_state=5)
    return X_train, X_test


@pytest.mark.parametrize("grid", [(1, 1), (1, 5), (6, 1), (3, 7)])
@pytest.mark.parametrize("seed", [0, 1])
def test_radius_covering_the_grid_equals_the_global_kernel(grid, seed):
    """``positional_similarity`` (every ``matching``) with a window that covers the whole
    grid (``r >= max(h, w) - 1``) vs ``global_patch_similarity`` (``pos_radius=None``):
    the same maximum over all patches of the retrieved images."""
    g = torch.Generator().manual_seed(seed)
    h, w = grid
    q = l2_normalize(torch.randn(3, h * w, 5, generator=g))
    m = l2_normalize(torch.randn(6, h * w, 5, generator=g))
    nbrs = torch.randint(0, 6, (3, 4), generator=g)
    want = global_patch_similarity(q, m, nbrs)
    for r in (max(h, w) - 1, max(h, w) + 3):
        for name in MATCHINGS:
            got = positional_similarity(q, m, nbrs, grid, r, matching=name)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("matching", MATCHINGS)
def test_detector_with_a_radius_beyond_the_grid_equals_pos_radius_none(textures, matching):
    """``RADDetector(pos_radius=100, matching=...)`` vs ``RADDetector(pos_radius=None)``:
    scores, maps and leave-one-out scores."""
    X_train, X_test = textures
    kw = dict(extractor="random", k_images=2, image_size=None)
    ref = RADDetector(pos_radius=None, **kw).fit(X_train)
    det = RADDetector(pos_radius=100, matching=matching, **kw).fit(X_train)
    np.testing.assert_allclose(det.decision_scores_, ref.decision_scores_, atol=1e-6)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    ref_maps, ref_scores = ref.anomaly_map(X_test, return_scores=True)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-6)
    np.testing.assert_allclose(maps, ref_maps, atol=1e-6)


@pytest.mark.parametrize("dtype, torch_dtype", [("float16", torch.float16),
                                                ("bfloat16", torch.bfloat16)])
def test_half_memory_fit_equals_a_float32_fit_cast_afterwards(textures, dtype, torch_dtype):
    """RAD: the half-precision fit (each batch cast as it is extracted) vs a float32 fit
    whose memory is cast afterwards (documented equal): same memory bits, same scores
    (similarities in float32 from the same half values)."""
    X_train, X_test = textures
    kw = dict(extractor="random", k_images=3, image_size=None, batch_size=2)
    half = RADDetector(memory_dtype=dtype, **kw).fit(X_train)
    full = RADDetector(**kw).fit(X_train)
    cast = copy.deepcopy(full)
    cast.memory_ = [m.to(torch_dtype) for m in full.memory_]
    for a, b in zip(half.memory_, cast.memory_):
        assert a.dtype == torch_dtype
        assert torch.equal(a, b)
    np.testing.assert_allclose(half.decision_function(X_test), cast.decision_function(X_test),
                               atol=1e-6)
    # and the half memory stays within its documented rounding of the float32 scores
    np.testing.assert_allclose(half.decision_function(X_test), full.decision_function(X_test),
                               atol=1e-2 if dtype == "bfloat16" else 1e-3)


def test_patchcore_decision_scores_are_leave_one_image_out_scores(textures):
    """PatchCore ``decision_scores_[i]`` (own patches excluded in the fitted memory) vs
    ``decision_function(X[i])`` of a detector fitted without image ``i`` (full memory:
    ``coreset_ratio=1``)."""
    X_train = textures[0][:5]
    kw = dict(extractor="random", image_size=None, coreset_ratio=1.0, random_state=0)
    det = PatchCoreDetector(**kw).fit(X_train)
    loo = [PatchCoreDetector(**kw).fit(np.delete(X_train, i, axis=0))
           .decision_function(X_train[i:i + 1])[0] for i in range(len(X_train))]
    np.testing.assert_allclose(det.decision_scores_, loo, rtol=1e-5, atol=1e-6)
    assert np.all(det.decision_scores_ > 0)


def test_patchcore_coreset_leave_one_out_scores_with_duplicated_images(textures):
    """With a coreset, an image's own memory patches leave with it and the patches of
    other images they covered stand in: a training set holding every image twice
    scores like refits without the image (its twin stays), not like an image with no
    twin (the bare memory gave up to 10x the refitted scores)."""
    X = np.concatenate([textures[0][:5]] * 2)
    kw = dict(extractor="random", image_size=None, coreset_ratio=0.1, random_state=0)
    det = PatchCoreDetector(**kw).fit(X)
    loo = np.array([PatchCoreDetector(**kw).fit(np.delete(X, i, axis=0))
                    .decision_function(X[i:i + 1])[0] for i in range(len(X))])
    assert det.decision_scores_.max() <= 1.1 * loo.max()
    assert det.threshold_ <= 1.1 * np.quantile(loo, 1 - det.contamination)


@pytest.mark.parametrize("ratio", [0.05, 0.3])
def test_patchcore_coreset_leave_one_out_lies_above_the_full_memory_one(textures, ratio):
    """The stand-ins are patches of the other images, so the coreset's leave-one-out
    scores are at least those against every patch of the other images."""
    X_train = textures[0]
    kw = dict(extractor="random", image_size=None, random_state=0)
    full = PatchCoreDetector(coreset_ratio=1.0, **kw).fit(X_train).decision_scores_
    det = PatchCoreDetector(coreset_ratio=ratio, **kw).fit(X_train)
    assert np.all(det.decision_scores_ >= full - 1e-5)


def test_patchcore_half_memory_equals_float32_memory_cast(textures):
    """PatchCore ``memory_dtype="float16"`` vs the float32 fit with its memory cast to
    float16 afterwards: same memory, same scores."""
    X_train, X_test = textures
    kw = dict(extractor="random", image_size=None, coreset_ratio=0.5, random_state=0)
    half = PatchCoreDetector(memory_dtype="float16", **kw).fit(X_train)
    full = PatchCoreDetector(**kw).fit(X_train)
    assert torch.equal(half.memory_, full.memory_.half())
    cast = copy.deepcopy(full)
    cast.memory_ = full.memory_.half()
    np.testing.assert_allclose(half.decision_function(X_test), cast.decision_function(X_test),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("matching", ["gather", "tiled"])
def test_a_huge_radius_costs_no_more_than_one_covering_the_grid(matching):
    """``positional_similarity(matching="gather"/"tiled", radius=10**6)`` vs the global
    kernel. Regression: the gather kernel's index had ``(2r+1)^2`` cells per position and
    the tiled kernel's blocks ``(tile + 2r)^2`` cells, whatever the grid (terabytes here;
    ``pos_radius=100`` on a 14x14 grid took 50 s against 0.2 s for ``"shared"``); offsets
    beyond the grid are now clipped, as the shared kernel does."""
    g = torch.Generator().manual_seed(0)
    q = l2_normalize(torch.randn(2, 12, 4, generator=g))
    m = l2_normalize(torch.randn(5, 12, 4, generator=g))
    nbrs = torch.randint(0, 5, (2, 3), generator=g)
    got = positional_similarity(q, m, nbrs, (3, 4), 10**6, matching=matching)
    torch.testing.assert_close(got, global_patch_similarity(q, m, nbrs), atol=1e-6, rtol=0)


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_extractor_name_instance_and_bound_method_agree(textures, cls):
    """``extractor="random"`` vs ``RandomConvExtractor()`` (left in train mode: it runs
    in eval mode, on the user's object) vs its bound ``forward``; and ``image_size=20``
    vs ``(20, 20)``: the same scores and maps."""
    from mlpapers.anomaly.rad import RandomConvExtractor

    X_train, X_test = textures
    kw = dict(image_size=None, random_state=0)
    ref = cls(extractor="random", **kw).fit(X_train)
    module = RandomConvExtractor().train()
    for ext in (module, RandomConvExtractor().forward):
        det = cls(extractor=ext, **kw).fit(X_train)
        np.testing.assert_array_equal(det.decision_function(X_test),
                                      ref.decision_function(X_test))
        np.testing.assert_array_equal(det.anomaly_map(X_test), ref.anomaly_map(X_test))
    assert module.training  # left as given
    a = cls(extractor="random", image_size=20, random_state=0).fit(X_train)
    b = cls(extractor="random", image_size=(20, 20), random_state=0).fit(X_train)
    np.testing.assert_array_equal(a.decision_function(X_test), b.decision_function(X_test))


def test_tiled_matching_clips_the_radius_per_axis_and_takes_no_queries():
    """tiled vs shared on an elongated grid with a radius beyond the long axis: the same
    scores, and the tiled candidate blocks bounded per axis ((T + 2 ry) x (T + 2 rx)
    cells, not (T + 2 max(h, w))^2: 260x slower on a 2 x 200 grid). Zero queries give
    an empty (0, L) result, as the other kernels (torch.cat of nothing raised)."""
    from mlpapers.anomaly.rad._kernels import _tile_window_index, tiled_patch_similarity
    from mlpapers.anomaly.rad._matching import shared_patch_similarity

    g = torch.Generator().manual_seed(0)
    h, w, C = 2, 30, 5
    q = l2_normalize(torch.randn(3, h * w, C, generator=g))
    m = l2_normalize(torch.randn(4, h * w, C, generator=g))
    nbrs = torch.tensor([[0, 1], [2, 3], [1, 2]])
    tiled = tiled_patch_similarity(q, m, nbrs, (h, w), 1000)
    torch.testing.assert_close(tiled, shared_patch_similarity(q, m, nbrs, (h, w), 1000))
    torch.testing.assert_close(tiled, shared_patch_similarity(q, m, nbrs, (h, w), w))
    cells = _tile_window_index(h, w, 1, w - 1, 4, "cpu")[0]
    assert cells.shape[1] == (4 + 2) * (4 + 2 * (w - 1))
    empty = tiled_patch_similarity(q[:0], m, nbrs[:0], (h, w), 1)
    assert empty.shape == (0, h * w)
