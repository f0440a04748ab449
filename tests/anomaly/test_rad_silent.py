"""Audit regressions: silent wrong answers on valid inputs (RAD, PatchCore, extractors)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
    PatchCoreDetector,
    RADDetector,
    RandomConvExtractor,
    TorchFeatureExtractor,
    check_images,
)
from mlpapers.anomaly.rad._kernels import knn_distances

from ._fake_vit import FakeViT


def _reference_rad(ext, X_train, X_test, k, r, sigma=1.0, ratio=0.01):
    """RAD from its definition, one position at a time in float64 (maps, scores)."""
    with torch.no_grad():
        f_tr, k_tr = ext(torch.from_numpy(X_train))
        f_te, k_te = ext(torch.from_numpy(X_test))
    cos = F.normalize(k_te.double(), dim=1) @ F.normalize(k_tr.double(), dim=1).T
    H, W = X_test.shape[-2:]
    maps = torch.zeros(len(X_test), H, W, dtype=torch.float64)
    for b in range(len(X_test)):
        ranked = sorted(range(len(X_train)), key=lambda i: (-float(cos[b, i]), i))[:k]
        for ft, fq in zip(f_tr, f_te):
            mem = F.normalize(ft[ranked].double(), dim=1)
            q = F.normalize(fq[b].double(), dim=0)
            h, w = q.shape[1:]
            s = torch.zeros(h, w, dtype=torch.float64)
            for y in range(h):
                for x in range(w):
                    win = mem[:, :, max(0, y - r):y + r + 1, max(0, x - r):x + r + 1]
                    s[y, x] = 1 - torch.einsum("c,nchw->nhw", q[:, y, x], win).max()
            maps[b] += F.interpolate(s.clamp_min(0)[None, None], size=(H, W), mode="bilinear",
                                     align_corners=False)[0, 0] / len(f_tr)
    t = torch.arange(-2, 3, dtype=torch.float64)
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    g = g / g.sum()
    maps = F.conv2d(maps[:, None], (g[:, None] * g[None])[None, None], padding=2)[:, 0]
    n = max(1, int(H * W * ratio))
    return maps.numpy(), maps.reshape(len(maps), -1).sort(1, descending=True).values[:, :n] \
        .mean(1).numpy()


@pytest.mark.parametrize("matching", ["auto", "shared", "tiled", "gather"])
def test_rad_equals_float64_reference_on_odd_non_square_grids(matching):
    """21x27 images: 11x14 and 6x7 grids, a duplicated memory image (retrieval ties)."""
    rng = np.random.default_rng(0)
    X_train = rng.random((5, 3, 21, 27)).astype(np.float32)
    X_train[3] = X_train[1]
    X_test = rng.random((3, 3, 21, 27)).astype(np.float32)
    det = RADDetector(extractor="random", k_images=2, image_size=None, matching=matching,
                      batch_size=2).fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    ref_maps, ref_scores = _reference_rad(RandomConvExtractor(), X_train, X_test, k=2, r=1)
    np.testing.assert_allclose(maps, ref_maps, atol=1e-5)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)


def test_hooked_outputs_are_not_overwritten_by_inplace_ops():
    """A hooked BatchNorm followed by ReLU(inplace=True): the features are the BN output."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                        nn.ReLU(inplace=True), nn.Conv2d(4, 8, 3, stride=2, padding=1))
    with torch.no_grad():
        net[1].running_mean.normal_()
    net.eval()
    x = torch.rand(2, 3, 8, 8)
    feats, key = TorchFeatureExtractor(net, ["1"], key_layer="1", mean=None, std=None)(x)
    with torch.no_grad():
        bn = net[1](net[0](x))
    assert float(bn.min()) < 0
    torch.testing.assert_close(feats[0], bn)
    torch.testing.assert_close(key, bn.mean(dim=(2, 3)))


def test_pil_images_of_wide_modes_are_not_clipped_to_8_bits():
    from PIL import Image

    rng = np.random.default_rng(0)
    g = rng.random((3, 8, 8)).astype(np.float32)
    as_float = [Image.fromarray(a) for a in g]  # mode "F"
    assert as_float[0].mode == "F"
    torch.testing.assert_close(check_images(as_float), check_images(g))
    g8 = np.round(g * 255).astype(np.int32)
    as_int = [Image.fromarray(a) for a in g8]  # mode "I", 8-bit values
    assert as_int[0].mode == "I"
    torch.testing.assert_close(check_images(as_int), check_images(g8.astype(np.uint8)))
    wide = [Image.fromarray((a * 1000).astype(np.uint16)) for a in g]  # mode "I;16"
    assert wide[0].mode.startswith("I;16")
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        check_images(wide)


def test_list_mixing_float_and_uint8_images_scales_each_image():
    rng = np.random.default_rng(0)
    grey = rng.random((8, 8)).astype(np.float32)
    colour = np.round(rng.random((8, 8, 3)) * 255).astype(np.uint8)
    t = check_images([grey, colour])
    torch.testing.assert_close(t[0], check_images(grey[None])[0])
    torch.testing.assert_close(t[1], check_images(colour[None])[0])


def test_knn_distances_are_exact_near_zero_and_under_a_common_offset():
    g = torch.Generator().manual_seed(0)
    m = torch.randn(200, 16, generator=g) + 100.0  # large shared offset, unit spread
    q = torch.cat([m[:10], torch.randn(30, 16, generator=g) + 100.0])
    d = knn_distances(q, m, k=2, chunk_size=1000)
    ref = torch.cdist(q.double(), m.double()).sort(1).values[:, :2]
    assert torch.all(d[:10, 0] == 0)  # a memory row is at distance exactly 0 from itself
    torch.testing.assert_close(d.double(), ref, rtol=1e-5, atol=1e-6)


def test_patchcore_training_images_score_exactly_zero_with_full_memory():
    rng = np.random.default_rng(0)
    X = rng.random((4, 3, 16, 16)).astype(np.float32)
    det = PatchCoreDetector(extractor="random", coreset_ratio=1.0, image_size=None).fit(X)
    np.testing.assert_array_equal(det.decision_function(X), 0.0)


def test_patchcore_half_memory_overflow_is_an_error():
    class Large(nn.Module):
        def forward(self, x):
            f = F.avg_pool2d(x, 2) * 1e6
            return [f], f.mean(dim=(2, 3))

    X = np.random.default_rng(0).random((3, 3, 8, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="overflow"):
        PatchCoreDetector(extractor=Large(), image_size=None, coreset_ratio=1.0,
                          memory_dtype="float16").fit(X)
    det = PatchCoreDetector(extractor=Large(), image_size=None, coreset_ratio=1.0).fit(X)
    assert math.isfinite(float(det.decision_function(X[:1])[0]))


def test_layer_weights_set_after_fit_are_used_like_the_other_scoring_params():
    rng = np.random.default_rng(0)
    X, T = rng.random((6, 3, 16, 16)).astype(np.float32), rng.random((3, 3, 16, 16))
    det = RADDetector(extractor="random", k_images=2, image_size=None).fit(X)
    det.set_params(layer_weights=[1.0, 0.0])
    ref = RADDetector(extractor="random", k_images=2, image_size=None,
                      layer_weights=[1.0, 0.0]).fit(X)
    np.testing.assert_array_equal(det.decision_function(T), ref.decision_function(T))
    with pytest.raises(ValueError, match="layer_weights has 3 entries"):
        det.set_params(layer_weights=[1.0, 1.0, 1.0]).decision_function(T)


def test_dino_extractor_keeps_the_listed_layer_order_and_deepest_cls_key():
    vit, x = FakeViT(), torch.rand(2, 3, 16, 16)
    one = {i: DinoViTExtractor(vit, layers=(i,))(x) for i in (1, 3)}
    feats, key = DinoViTExtractor(vit, layers=(3, 1))(x)
    torch.testing.assert_close(feats[0], one[3][0][0])  # first listed: block 3
    torch.testing.assert_close(feats[1], one[1][0][0])
    torch.testing.assert_close(key, one[3][1])  # CLS of the deepest block
    vit.n_blocks = 4
    feats_neg, _ = DinoViTExtractor(vit, layers=(-1, 1))(x)
    torch.testing.assert_close(feats_neg[0], one[3][0][0])


def test_a_single_hwc_image_is_not_read_as_a_batch_of_grayscale_images():
    img = np.random.default_rng(0).random((32, 24, 3))
    with pytest.raises(ValueError, match=r"X\[None\]"):
        check_images(img)
    assert check_images(img[None]).shape == (1, 3, 32, 24)
    assert check_images(img[:, :, 0][None]).shape == (1, 3, 32, 24)


def test_a_failed_refit_leaves_no_stale_memory():
    class Large(nn.Module):
        def forward(self, x):
            f = F.avg_pool2d(x, 2) * 1e6
            return [f], f.mean(dim=(2, 3))

    from sklearn.exceptions import NotFittedError

    rng = np.random.default_rng(0)
    X = rng.random((3, 3, 8, 8)).astype(np.float32)
    det = PatchCoreDetector(extractor="random", image_size=None, coreset_ratio=1.0,
                            memory_dtype="float16").fit(X)
    with pytest.raises(ValueError, match="overflow"):
        det.set_params(extractor=Large()).fit(rng.random((2, 3, 12, 12)).astype(np.float32))
    with pytest.raises(NotFittedError):
        det.decision_function(X)
    rad = RADDetector(extractor="random", image_size=None, k_images=2).fit(X)
    with pytest.raises(ValueError, match="layer_weights"):
        rad.set_params(layer_weights=[1, 1, 1]).fit(X)
    with pytest.raises(NotFittedError):
        rad.decision_function(X)


def test_layer_weights_near_the_float_range_are_normalised():
    # weights of 1e308 summed to inf: every normalised weight was 0 and the fusion
    # failed with "torch.cat(): expected a non-empty list of Tensors"
    from mlpapers.datasets import make_texture_anomalies

    X_train, X_test, _, _ = make_texture_anomalies(n_train=6, n_test=2, image_size=32,
                                                   random_state=0)
    kw = dict(extractor="random", image_size=32, k_images=3)
    huge = RADDetector(layer_weights=[1e308, 1e308], **kw).fit(X_train)
    plain = RADDetector(layer_weights=[1.0, 1.0], **kw).fit(X_train)
    np.testing.assert_array_equal(huge.layer_weights_, [0.5, 0.5])
    np.testing.assert_array_equal(huge.score_samples(X_test), plain.score_samples(X_test))


@pytest.mark.parametrize("other", [np.uint8, np.int64, np.float32])
def test_each_image_of_a_list_keeps_its_own_pixel_rule(other):
    # booleans are 0/1 and integers are divided by 255, per image: a boolean image
    # listed with a uint8 one was stacked into uint8 and divided by 255 (1 -> 1/255)
    b = np.zeros((16, 16), bool)
    b[4:12, 4:12] = True
    o = b.astype(other) * (1 if other == np.float32 else 255)
    alone = check_images([b])
    mixed = check_images([b, o])
    torch.testing.assert_close(mixed[0], alone[0])
    torch.testing.assert_close(mixed[1], alone[0])
    assert float(alone.amax()) == 1.0
