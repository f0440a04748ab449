"""RAD and PatchCore: tests that kill mutants the rest of the suite let through.

Each test asserts a real property (a documented bound, an exact reference, a
closed form or a documented behaviour) that a plausible one-token bug in the
kernels or the estimators would break and that no other test checks.
"""

import numpy as np
import pytest
import torch

from mlpapers.anomaly import PatchCoreDetector, RADDetector
from mlpapers.anomaly.rad._kernels import (
    global_patch_similarity,
    l2_normalize,
    tiled_patch_similarity,
)
from mlpapers.datasets import make_texture_anomalies

from .test_rad_bounds import _brute, _LargestNewTensor
from .test_rad_bounds import _data as _problem


def test_tiled_and_global_chunk_bounds_hold_when_all_retrieved_images_fit():
    # the bound must also hold on the tile / query-image chunking paths (taken when one
    # chunk holds every retrieved image), not only when retrieved images are split
    h = w = 8
    q, mem, nb = _problem(B=1, h=h, w=w, C=8, N=6, k=2)
    unit = (4 + 2) ** 2 * 16                      # one 4x4 tile x one retrieved image
    bound = 2 * unit                              # k images of one tile, not all 4 tiles
    with _LargestNewTensor() as probe:
        got = tiled_patch_similarity(q, mem, nb, (h, w), 1, chunk_size=bound)
    assert probe.largest <= bound
    torch.testing.assert_close(got, _brute(q, mem, nb, h, w, 1), rtol=0, atol=1e-6)

    h = w = 6
    q, mem, nb = _problem(B=3, h=h, w=w, C=8, N=6, k=2, seed=1)
    bound = 2 * (h * w) ** 2                      # k retrieved images of one query image
    with _LargestNewTensor() as probe:
        got = global_patch_similarity(q, mem, nb, chunk_size=bound)
    assert probe.largest <= bound
    torch.testing.assert_close(got, _brute(q, mem, nb, h, w, None), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def textures():
    return make_texture_anomalies(10, 6, image_size=24, random_state=0)


def test_decision_scores_are_leave_one_out_scores(textures):
    # decision_scores_[i] is the score of training image i against a memory of the
    # other training images: a detector fitted without image i gives the same value
    X = textures[0][:6]
    kw = dict(extractor="random", k_images=3, image_size=None)
    det = RADDetector(**kw).fit(X)
    loo = [RADDetector(**kw).fit(np.delete(X, i, axis=0)).decision_function(X[i:i + 1])[0]
           for i in range(len(X))]
    np.testing.assert_allclose(det.decision_scores_, loo, rtol=1e-5, atol=1e-6)
    assert np.all(det.decision_scores_ > 1e-3)


@pytest.mark.parametrize("Det", [RADDetector, PatchCoreDetector])
def test_predict_flags_scores_strictly_above_the_threshold(textures, Det):
    # PyOD's rule, as documented: an image scoring exactly threshold_ is normal
    X, X_test = textures[0][:6], textures[1][:4]
    det = Det(extractor="random", image_size=None).fit(X)
    scores = det.decision_function(X_test)
    det.threshold_ = float(np.sort(scores)[1])
    np.testing.assert_array_equal(det.predict(X_test), (scores > det.threshold_).astype(int))
    assert det.predict(X_test).sum() == 2


class _GridFeatures(torch.nn.Module):
    """Fixed 1x1 convs of 2x2- and 4x4-average-pooled pixels: known (n, 4, H/2, W/2)
    and (n, 3, H/4, W/4) maps (``layers`` picks them)."""

    def __init__(self, layers=(0,)):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = [torch.randn(4, 3, 1, 1, generator=g), torch.randn(3, 3, 1, 1, generator=g)]
        self.layers = layers

    def forward(self, x):
        f = [torch.nn.functional.conv2d(torch.nn.functional.avg_pool2d(x, 2 ** (i + 1)) - 0.5,
                                        self.w[i]) for i in self.layers]
        return f, f[0].mean(dim=(2, 3))


def _mean3x3(f):
    """(n, C, h, w) -> (n, h, w, C): mean over each clipped 3x3 neighbourhood (loop)."""
    n, C, h, w = f.shape
    out = torch.empty(n, h, w, C, dtype=torch.float64)
    for y in range(h):
        for x in range(w):
            out[:, y, x] = f[:, :, max(0, y - 1):y + 2, max(0, x - 1):x + 2].mean(dim=(2, 3))
    return out


def _bilinear(a, size):
    """Bilinear resize of (..., h, w) with half-pixel centres (numpy loop reference)."""
    a = np.asarray(a, dtype=np.float64)

    def weights(n_in, n_out):
        m = np.zeros((n_out, n_in))
        for i in range(n_out):
            src = min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1)
            i0 = int(np.floor(src))
            i1 = min(i0 + 1, n_in - 1)
            m[i, i0] += 1 - (src - i0)
            m[i, i1] += src - i0
        return m

    return weights(a.shape[-2], size[0]) @ a @ weights(a.shape[-1], size[1]).T


def test_patchcore_memory_is_the_3x3_neighbourhood_mean_of_every_patch(textures):
    # PatchCore's local aggregation: each memory patch is the mean of the feature
    # vectors in its 3x3 neighbourhood, clipped at the borders; a deeper, coarser layer
    # is aggregated, then bilinearly resized to the first layer's grid
    X = textures[0][:2]
    ext = _GridFeatures(layers=(0, 1))
    det = PatchCoreDetector(extractor=ext, coreset_ratio=1.0, image_size=None).fit(X)
    with torch.no_grad():
        f1, f2 = (f.double() for f in ext(torch.from_numpy(X))[0])  # floats in [0, 1]
    n, _, h, w = f1.shape
    e2 = _bilinear(_mean3x3(f2).permute(0, 3, 1, 2).numpy(), (h, w))  # (n, C2, h, w)
    want = np.concatenate([_mean3x3(f1).numpy(), e2.transpose(0, 2, 3, 1)], axis=3)
    np.testing.assert_allclose(det.memory_.numpy(), want.reshape(n * h * w, -1),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(det.memory_image_ids_.numpy(), np.repeat(np.arange(n), h * w))


def test_patchcore_scores_and_maps_equal_brute_force_nearest_patches(textures):
    # training scores: max over an image's patches of the distance to the nearest patch
    # of another image; test maps (no blur): the nearest-patch distances, bilinearly
    # upsampled to the image size; test scores: their maximum over patches
    X, X_test = textures[0][:5], textures[1][:3]
    ext = _GridFeatures()
    det = PatchCoreDetector(extractor=ext, coreset_ratio=1.0, image_size=None,
                            smoothing_sigma=0.0).fit(X)
    mem = det.memory_.double()
    ids = det.memory_image_ids_
    d = torch.cdist(mem, mem)
    d[ids[:, None] == ids[None, :]] = float("inf")
    loo = d.min(1).values.reshape(len(X), -1).amax(1)
    np.testing.assert_allclose(det.decision_scores_, loo.numpy(), rtol=1e-4)
    with torch.no_grad():
        f = ext(torch.from_numpy(X_test))[0][0].double()
    emb = _mean3x3(f)
    nn = torch.cdist(emb.reshape(-1, emb.shape[-1]), mem).min(1).values.reshape(emb.shape[:3])
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    np.testing.assert_allclose(maps, _bilinear(nn.numpy(), X_test.shape[-2:]), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(scores, nn.reshape(len(X_test), -1).amax(1).numpy(), rtol=1e-4)


def test_patchcore_image_holding_the_whole_memory_is_scored_against_every_other_patch(
        textures):
    # a one-patch coreset: the image holding that patch has no memory patch left out of
    # itself; every other image's patches were covered by its patch and stand in, so
    # its score is the full-memory leave-one-out score (it used to be the largest
    # other score, a placeholder)
    X = textures[0][:4]
    kw = dict(extractor="random", image_size=None, random_state=0)
    det = PatchCoreDetector(coreset_ratio=1e-6, **kw).fit(X)
    assert len(det.memory_) == 1
    j = int(det.memory_image_ids_[0])
    full = PatchCoreDetector(coreset_ratio=1.0, **kw).fit(X).decision_scores_
    assert np.all(np.isfinite(det.decision_scores_))
    np.testing.assert_allclose(det.decision_scores_[j], full[j], rtol=1e-5)


def test_retrieval_breaks_ties_by_the_lower_memory_index():
    # documented: equal key similarities are ranked by memory index, whatever the batch
    from mlpapers.anomaly.rad._kernels import retrieve_neighbours

    # distinct +-1 keys of norm 2: the cosines are exact multiples of 1/4, so the 40
    # copies of a query's own key tie exactly at 1 and must come in index order
    keys = torch.tensor([[1.0, 1, 1, 1, 0], [1, -1, 1, 1, 0], [1, 1, -1, 0, 1],
                         [-1, 1, 0, 1, 1], [0, 1, 1, -1, -1]])
    memory = keys[torch.arange(200) % 5]            # every key 40 times
    got = retrieve_neighbours(keys, memory, k=60)
    for b in range(5):
        assert torch.equal(got[b, :40], torch.arange(b, 200, 5)), b
    for sl in (slice(0, 2), slice(3, 5)):              # the same ranking in any batch
        assert torch.equal(retrieve_neighbours(keys[sl], memory, k=60), got[sl])


def test_leave_one_out_retrieval_never_returns_the_excluded_image():
    # k above the number of other images: every other image, never the excluded one
    # (also for memory index 0, batch by batch as the estimator calls it)
    from mlpapers.anomaly.rad._kernels import retrieve_neighbours

    mem = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    for i in range(6):
        got = retrieve_neighbours(mem[i:i + 1], mem, k=10, exclude=torch.tensor([i]))
        assert got.shape == (1, 5)
        assert sorted(got[0].tolist()) == [j for j in range(6) if j != i]


def test_l2_normalize_keeps_zero_vectors_zero():
    x = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0]])
    torch.testing.assert_close(l2_normalize(x), torch.tensor([[0.0, 0.0, 0.0], [0.6, 0.0, 0.8]]))


def test_greedy_coreset_is_exact_under_a_large_common_offset():
    # CNN activations share a large offset; the float32 selection must still be the
    # float64 farthest-point sequence (same start), not one ruined by cancellation
    from mlpapers.anomaly.rad._kernels import greedy_coreset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, 4, generator=g, dtype=torch.float64)
    xf = (x + 1e4).float()
    got = greedy_coreset(xf, 12, generator=torch.Generator().manual_seed(3),
                         projection_dim=None)
    x = xf.double()  # the reference in float64 on the exact input the code sees
    sel = [int(got[0])]
    d = ((x - x[sel[0]]) ** 2).sum(1)
    for _ in range(11):
        sel.append(int(torch.argmax(d)))
        d = torch.minimum(d, ((x - x[sel[-1]]) ** 2).sum(1))
    assert got.tolist() == sel


def test_gaussian_blur_of_a_point_is_the_documented_truncated_kernel():
    # default kernel: 2 ceil(2 sigma) + 1 taps of exp(-t^2 / (2 sigma^2)), normalised
    from mlpapers.anomaly.rad._kernels import gaussian_blur

    for sigma in (0.6, 1.0, 1.7):
        half = int(np.ceil(2 * sigma))
        t = np.arange(-half, half + 1)
        g = np.exp(-t ** 2 / (2 * sigma ** 2))
        g /= g.sum()
        img = torch.zeros(1, 15, 15, dtype=torch.float64)
        img[0, 7, 7] = 1.0
        want = np.zeros((15, 15))
        want[7 - half:8 + half, 7 - half:8 + half] = np.outer(g, g)
        np.testing.assert_allclose(gaussian_blur(img, sigma)[0].numpy(), want, atol=1e-12)


def test_choose_matching_follows_the_documented_cost_rule_on_thin_grids():
    # (2 ry + 1)(2 rx + 1) |U| <= 1.25 k (T + 2 ry)(T + 2 rx), ry = min(r, h-1),
    # rx = min(r, w-1): both kernels clip the radius per axis
    from mlpapers.anomaly.rad._matching import choose_matching

    def rule(nb, h, w, r, T=4):
        U = len(torch.unique(nb))
        T = min(T, max(h, w))
        ry, rx = min(r, h - 1), min(r, w - 1)
        shared = (2 * ry + 1) * (2 * rx + 1) * U
        return "shared" if shared <= 1.25 * nb.shape[1] * (T + 2 * ry) * (T + 2 * rx) \
            else "tiled"

    nb = torch.arange(30).reshape(15, 2)            # k = 2, |U| = 30
    for h, w, r in [(1, 8, 3), (8, 1, 3), (2, 9, 2), (1, 1, 5), (3, 3, 1), (5, 4, 2),
                    (2, 40, 1000)]:
        assert choose_matching(nb, (h, w), r) == rule(nb, h, w, r), (h, w, r)
    # one grid row: the tiled blocks have no vertical margin either (4 x 10 cells, not
    # 10 x 10), so the tiled kernel is the cheaper one
    assert choose_matching(nb, (1, 8), 3) == "tiled"
    assert choose_matching(torch.zeros(15, 2, dtype=torch.long), (1, 8), 3) == "shared"


def test_maps_of_memory_images_are_clamped_at_zero(textures):
    # documented: 1 - cos is clamped at 0 (rounding of the cosine, here of a float16
    # memory, would otherwise give slightly negative anomaly maps)
    X = textures[0]
    det = RADDetector(extractor="random", k_images=4, image_size=None,
                      memory_dtype="float16").fit(X)
    maps, scores = det.anomaly_map(X, return_scores=True)
    assert maps.min() >= 0.0 and scores.min() >= 0.0
    assert maps.max() < 1e-3
