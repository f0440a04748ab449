"""RAD and PatchCore at user scale: scoring memory and the chunked k-NN kernel."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector
from mlpapers.anomaly.rad._patchcore_kernels import knn_distances
from tests._scale import peak_mb, requires_peak_rss

_SETUP = """
import numpy as np
from mlpapers.anomaly.rad import RADDetector
rng = np.random.default_rng(0)
X_train = (rng.random((12, 3, 64, 64)) * 255).astype(np.uint8)
det = RADDetector(extractor="random", k_images=4, image_size=None,
                  chunk_size=2**16).fit(X_train)
X = (rng.random(({n}, 3, 64, 64)) * 255).astype(np.uint8)
"""
# RandomConvExtractor on 64x64 images: 32 x 32 x 32 + 64 x 16 x 16 float32 feature
# values per image (192 KiB); chunk_size=2**16 makes scoring groups of one batch of 16
_FEATURE_MB = (32 * 32 * 32 + 64 * 16 * 16) * 4 / 2**20


@requires_peak_rss
def test_anomaly_map_memory_is_the_output_plus_one_group():
    # The features of all test images used to be extracted at once and then normalised
    # into a copy: 2 x 192 KiB per image (150 MB for 400 images), several times the
    # maps (16 KiB per image). Scored group by group, the features of one group exist
    # at a time: the peak is the maps (6.3 MB) plus a group, below a third of the
    # features of all images held once.
    n = 400
    peak = peak_mb(_SETUP.format(n=n), "maps = det.anomaly_map(X)")
    all_features_mb = n * _FEATURE_MB  # 75 MB
    assert peak < all_features_mb / 3, (peak, all_features_mb)


def _fitted(chunk_size, **kw):
    rng = np.random.default_rng(1)
    X_train = (rng.random((10, 3, 32, 32)) * 255).astype(np.uint8)
    X = (rng.random((40, 3, 32, 32)) * 255).astype(np.uint8)
    det = RADDetector(extractor="random", k_images=3, image_size=None, batch_size=4,
                      chunk_size=chunk_size, **kw).fit(X_train)
    return det, X


def test_scores_by_groups_equal_scores_image_by_image():
    # chunk_size=2**12 gives groups of one batch of 4 images (10 groups); every image's
    # score and map is that of the image scored on its own (the matching is exact per
    # image; the kernel may differ per batch, hence float rounding)
    det, X = _fitted(2**12, matching="gather")
    assert det._score_group_size(det.feature_shapes_) == 4
    maps, scores = det.anomaly_map(X, return_scores=True)
    np.testing.assert_array_equal(scores, det.decision_function(X))
    for i in (0, 3, 4, 17, 39):
        m1, s1 = det.anomaly_map(X[i:i + 1], return_scores=True)
        np.testing.assert_allclose(scores[i:i + 1], s1, rtol=0, atol=1e-6)
        np.testing.assert_allclose(maps[i:i + 1], m1, rtol=0, atol=1e-6)
    # one group for all: same values
    big, _ = _fitted(2**24, matching="gather")
    assert big._score_group_size(big.feature_shapes_) >= len(X)
    np.testing.assert_allclose(big.decision_function(X), scores, rtol=0, atol=1e-6)


def test_patchcore_scores_by_groups_equal_one_group():
    rng = np.random.default_rng(2)
    X_train = (rng.random((6, 3, 32, 32)) * 255).astype(np.uint8)
    X = (rng.random((30, 3, 32, 32)) * 255).astype(np.uint8)
    kw = dict(extractor="random", image_size=None, coreset_ratio=0.5, batch_size=4,
              random_state=0)
    small = PatchCoreDetector(chunk_size=2**12, **kw).fit(X_train)
    big = PatchCoreDetector(chunk_size=2**24, **kw).fit(X_train)
    assert small._score_group_size(small.feature_shapes_) == 4
    np.testing.assert_array_equal(small.memory_, big.memory_)
    m_small, s_small = small.anomaly_map(X, return_scores=True)
    m_big, s_big = big.anomaly_map(X, return_scores=True)
    np.testing.assert_allclose(s_small, s_big, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(m_small, m_big, rtol=1e-5, atol=1e-5)


def test_knn_distances_blocks_match_float64_reference():
    # query and memory blocks (q_block = 2000 rows, m_block = 1 row at chunk_size 2000)
    # give the exact float64 nearest distances, with and without group exclusion
    g = torch.Generator().manual_seed(0)
    q = torch.rand(2500, 6, generator=g) * 3 + 10  # a common offset, as CNN activations
    m = torch.rand(301, 6, generator=g) * 3 + 10
    gq, gm = torch.randint(0, 5, (2500,), generator=g), torch.randint(0, 5, (301,), generator=g)
    d2 = torch.cdist(q.double(), m.double()) ** 2
    ref = d2.sort(dim=1).values[:, :3].sqrt()
    np.testing.assert_allclose(knn_distances(q, m, k=3, chunk_size=2000), ref,
                               rtol=1e-5, atol=1e-5)
    ref_ex = d2.masked_fill(gq[:, None] == gm[None, :], torch.inf).min(dim=1).values.sqrt()
    got = knn_distances(q, m, k=1, chunk_size=2000, exclude_query_group=gq,
                        memory_group=gm)[:, 0]
    np.testing.assert_allclose(got, ref_ex, rtol=1e-5, atol=1e-5)
    assert knn_distances(q[:0], m).shape == (0, 1)


@pytest.mark.parametrize("cls", ["RADDetector", "PatchCoreDetector"])
def test_scoring_in_several_groups_shows_one_progress_bar(monkeypatch, cls):
    # each group opened its own extraction (and RAD matching) bar: 2 x groups bars,
    # each restarting at batch 0; one group keeps the per-batch bars of before
    import mlpapers.anomaly as anomaly
    from mlpapers._utils import _progress

    shown = []
    original = _progress.ProgressLogger.__iter__

    def recording(self):
        if self.verbose:
            shown.append((self.desc, self.total))
        return original(self)

    monkeypatch.setattr(_progress.ProgressLogger, "__iter__", recording)
    rng = np.random.default_rng(0)
    Xtr, Xte = rng.random((12, 32, 32, 3)), rng.random((40, 32, 32, 3))
    kw = dict(k_images=3) if cls == "RADDetector" else {}
    det = getattr(anomaly, cls)(extractor="random", image_size=None, batch_size=4,
                                chunk_size=2**10, random_state=0, **kw).fit(Xtr)
    det.set_params(verbose=1)
    shown.clear()
    det.decision_function(Xte)
    assert shown == [(f"{cls} score (40 images in groups of 4)", 10)]
    det.set_params(chunk_size=2**24)
    shown.clear()
    det.decision_function(Xte)
    assert (f"{cls} score", 10) in shown and all(total == 10 for _, total in shown)
