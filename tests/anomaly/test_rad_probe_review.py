"""Regressions from a probe of ``anomaly.rad``: the pixel-range warning of normalised
float images, the Gaussian blur of a ``smoothing_sigma`` far wider than the map, and
the pixel count of ``top_ratio``."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector, _maps, check_images
from mlpapers.anomaly.rad._maps import _blur_matrix, gaussian_blur, top_ratio_pool
from mlpapers.datasets import make_texture_anomalies

X_TRAIN, X_TEST, _, _ = make_texture_anomalies(6, 3, image_size=16, random_state=0)


def _range_warnings(X) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_images(X)
    return [str(w.message) for w in caught if "expected in [0, 1]" in str(w.message)]


# -- 1. float images normalised to [-1, 1] or [-0.5, 0.5] -------------------------------


@pytest.mark.parametrize("normalise", [
    lambda X: X * 2 - 1,                  # [-1, 1], the GAN / diffusion convention
    lambda X: X - 0.5,                    # [-0.5, 0.5]
    lambda X: X - X.mean(),               # mean subtracted
    lambda X: (X - 0.45) / 0.22,          # ImageNet-normalised (warned before too)
])
def test_normalised_float_images_warn(normalise):
    X = normalise(X_TRAIN)
    assert len(_range_warnings(X)) == 1
    with pytest.warns(UserWarning, match=r"expected in \[0, 1\]"):
        RADDetector(extractor="random", k_images=2, image_size=None).fit(X)


def test_images_in_unit_range_with_small_noise_do_not_warn():
    rng = np.random.default_rng(0)
    dark = X_TRAIN - X_TRAIN.min()  # in [0, 1] with black pixels
    noisy = dark + rng.normal(0, 0.05, X_TRAIN.shape).astype(np.float32)  # unclipped
    assert -0.2 < noisy.min() < -0.03
    black = np.zeros((4, 3, 16, 16), np.float32) - 1e-6  # rounding below 0
    resampled = np.clip(X_TRAIN, 0, 1) * 1.1 - 0.05     # overshoot of a sharp resize
    for X in (noisy, black, resampled, X_TRAIN, X_TEST):
        assert _range_warnings(X) == []
    # the package's generators never warn, whatever their noise or source
    for kw in ({}, {"noise": 0.0}, {"noise": 0.5}):
        for X in make_texture_anomalies(4, 4, image_size=16, random_state=1, **kw)[:2]:
            assert _range_warnings(X) == []


# -- 2. a smoothing_sigma far wider than the map ----------------------------------------

def _reference_blur_matrix(n: int, sigma: float, padding: str, kernel_size=None):
    """The blur matrix built from the whole kernel, as it was before the kernel was
    capped (fine for a kernel of a few million taps)."""
    if kernel_size is None:
        kernel_size = 2 * math.ceil(2 * sigma) + 1
    t = torch.arange(kernel_size, dtype=torch.float64) - kernel_size // 2
    g = torch.exp(-0.5 * (t / sigma) ** 2)
    g = g / g.sum()
    half = len(g) // 2
    r = torch.arange(n)
    u = r[:, None] + torch.arange(len(g))[None, :] - half
    if padding == "reflect":
        u = torch.zeros_like(u) if n == 1 else torch.remainder(u, 2 * (n - 1))
        u = torch.where(u >= n, 2 * (n - 1) - u, u)
    inside = (u >= 0) & (u < n)
    G = torch.zeros(n, n, dtype=torch.float64)
    G.index_put_((r[:, None].expand_as(u)[inside], u[inside]), g.expand_as(u)[inside],
                 accumulate=True)
    return G


def _reference_blur(maps, sigma, kernel_size, padding):
    """Separable blur with the whole kernel and explicit padding of both axes."""
    G_h = _reference_blur_matrix(maps.shape[-2], sigma, padding, kernel_size)
    G_w = _reference_blur_matrix(maps.shape[-1], sigma, padding, kernel_size)
    return G_h @ maps.double() @ G_w.T


@pytest.fixture
def no_huge_arange(monkeypatch):
    """Refuse a ``torch.arange`` of more than 10 million values (a kernel of one tap
    per pixel of a huge sigma) before it is allocated."""
    original = torch.arange

    def guarded(*args, **kwargs):
        bounds = [float(a) for a in args]
        start, end = (0.0, bounds[0]) if len(bounds) == 1 else bounds[:2]
        step = bounds[2] if len(bounds) > 2 else 1.0
        if (end - start) / step > 1e7:
            raise MemoryError(f"torch.arange of {(end - start) / step:.3g} values")
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "arange", guarded)


@pytest.mark.parametrize("padding", ["zeros", "reflect"])
@pytest.mark.parametrize("sigma", [0.5, 4.0, 30.0])
def test_ordinary_sigmas_give_the_whole_kernels_blur(sigma, padding):
    for n in (1, 2, 5, 16, 64, 130):
        got, want = _blur_matrix(n, sigma, padding), _reference_blur_matrix(n, sigma, padding)
        if math.ceil(2 * sigma) <= n - 1:  # the kernel fits: the same code as before
            assert torch.equal(got, want)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-15)


@pytest.mark.parametrize("padding", ["zeros", "reflect"])
@pytest.mark.parametrize("n, sigma", [(16, 200.0), (5, 1000.0), (3, 3e5), (2, 3e5)])
def test_a_kernel_wider_than_the_map_gives_the_whole_kernels_blur(n, sigma, padding):
    # (3, 3e5) and (2, 3e5): 1.2 million taps, summed by Euler-Maclaurin
    want = _reference_blur_matrix(n, sigma, padding)
    torch.testing.assert_close(_blur_matrix(n, sigma, padding), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("period", [1, 2, 14, 62])
def test_euler_maclaurin_class_sums_equal_the_direct_sums(period):
    for sigma in (1e4, 1e6):
        lo, hi = _maps._tap_range(sigma, None)
        direct = _maps._gaussian_class_sums(sigma, lo, hi, period, "direct")
        em = _maps._gaussian_class_sums(sigma, lo, hi, period, "euler-maclaurin")
        torch.testing.assert_close(em, direct, rtol=1e-12, atol=0)


@pytest.mark.parametrize("padding", ["zeros", "reflect"])
@pytest.mark.parametrize("shape, sigma, kernel_size", [
    ((2, 16, 16), 200.0, None), ((2, 5, 40), 4.0, None), ((1, 16, 16), 1.0, 41),
    ((1, 7, 9), 1.0, 10**12 + 1),  # taps beyond 40 sigma are exactly zero
])
def test_gaussian_blur_with_a_kernel_wider_than_the_map(shape, sigma, kernel_size, padding,
                                                         no_huge_arange):
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    if kernel_size is not None and kernel_size > 10**6:
        ref = _reference_blur(x, sigma, 81, padding)
    else:
        ref = _reference_blur(x, sigma, kernel_size, padding)
    got = gaussian_blur(x, sigma, kernel_size, padding)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("padding", ["zeros", "reflect"])
def test_a_huge_sigma_builds_a_map_sized_blur_of_the_limit(padding, no_huge_arange):
    # sigma=1e9 used to build 4e9 taps (32 GB); the blur is an (n, n) matrix and equals
    # the limit of the whole kernel: a flat kernel of 4 sigma + 1 taps
    n = 12
    for sigma in (1e9, 1e15):
        G = _blur_matrix(n, sigma, padding)
        assert G.shape == (n, n) and bool(torch.isfinite(G).all())
        if padding == "zeros":  # every tap of the map is 1 / (sum of all taps)
            z = sigma * math.sqrt(2 * math.pi) * math.erf(math.sqrt(2))
            torch.testing.assert_close(G, torch.full((n, n), 1 / z, dtype=torch.float64),
                                       rtol=1e-7, atol=0)
        else:  # reflect: one period of the mirrored map, edge pixels once, others twice
            w = torch.full((n,), 2.0, dtype=torch.float64)
            w[[0, -1]] = 1.0
            torch.testing.assert_close(G, (w / w.sum()).expand(n, n), rtol=1e-6, atol=0)
    x = torch.rand(2, n, n + 3)
    assert gaussian_blur(x, 1e9, padding=padding).shape == x.shape


@pytest.mark.parametrize("padding", ["zeros", "reflect"])
def test_detectors_accept_a_huge_smoothing_sigma(padding, no_huge_arange):
    base = dict(extractor="random", image_size=None, blur_padding=padding)
    flat = RADDetector(k_images=2, smoothing_sigma=0.0, **base).fit(X_TRAIN)
    det = RADDetector(k_images=2, smoothing_sigma=1e9, **base).fit(X_TRAIN)
    maps, scores = det.anomaly_map(X_TEST, return_scores=True)
    assert np.isfinite(maps).all() and np.isfinite(scores).all()
    raw = torch.as_tensor(flat.anomaly_map(X_TEST), dtype=torch.float64)
    n = raw.shape[-1]
    want = _blur_matrix(n, 1e9, padding) @ raw @ _blur_matrix(n, 1e9, padding).T
    np.testing.assert_allclose(maps, want.numpy(), rtol=1e-4, atol=1e-12)
    if padding == "reflect":  # the whole map is its (reflect-weighted) mean
        assert np.ptp(maps, axis=(1, 2)).max() < 1e-5 * maps.max()
    pc = PatchCoreDetector(extractor="random", image_size=None, smoothing_sigma=1e9,
                           random_state=0).fit(X_TRAIN)
    assert np.isfinite(pc.decision_function(X_TEST)).all()


# -- 3. top_ratio pools floor(rho * H * W) pixels -----------------------------------------

@pytest.mark.parametrize("ratio, n_pixels, count", [
    (0.29, 100, 29), (0.57, 100, 57), (0.58, 100, 58), (0.07, 100, 7), (0.1 * 3, 10, 3),
    (0.3, 10, 3), (0.01, 100, 1), (0.01, 99, 1), (0.5, 3, 1), (0.0, 50, 1), (1.0, 37, 37),
    (0.295, 100, 29),
])
def test_top_ratio_pool_averages_floor_of_ratio_times_pixels(ratio, n_pixels, count):
    maps = torch.arange(2 * n_pixels, dtype=torch.float64).reshape(2, n_pixels)
    want = maps[:, n_pixels - count:].mean(dim=1)
    torch.testing.assert_close(top_ratio_pool(maps, ratio), want)


def test_detector_score_is_the_mean_of_the_top_29_of_100_pixels():
    det = RADDetector(extractor="random", k_images=2, image_size=None,
                      top_ratio=0.29).fit(X_TRAIN[:, :, :10, :10])
    maps, scores = det.anomaly_map(X_TEST[:, :, :10, :10], return_scores=True)
    assert maps.shape == (3, 10, 10)
    top = np.sort(maps.reshape(len(maps), -1), axis=1)[:, -29:]
    np.testing.assert_allclose(scores, top.mean(axis=1), rtol=1e-6)


def test_reference_blur_helper_matches_a_2d_convolution():
    # the reference of the tests above is itself the plain zero-padded 2-D convolution
    x = torch.rand(1, 9, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    t = torch.arange(5, dtype=torch.float64) - 2
    g = torch.exp(-0.5 * t**2)
    k = torch.outer(g, g) / g.sum() ** 2
    conv = F.conv2d(x[:, None], k[None, None], padding=2)[:, 0]
    torch.testing.assert_close(_reference_blur(x, 1.0, None, "zeros"), conv)


def test_a_list_of_differently_sized_float_images_warns_once_about_their_range():
    # each image was validated on its own: one range warning per image (1000 images,
    # 1000 warnings, each quoting its own range), where one array of them warns once
    rng = np.random.default_rng(0)
    imgs = [rng.random((20 + i % 7, 24, 3)).astype(np.float32) * 255 for i in range(12)]
    imgs[3] = (imgs[3] * 0 + 7).astype(np.uint8)  # integers are checked one by one
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RADDetector(extractor="random", image_size=32, k_images=3).fit(imgs)
    got = [str(w.message) for w in caught if "expected in [0, 1]" in str(w.message)]
    lo = min(float(a.min()) for a in imgs if a.dtype.kind == "f")
    hi = max(float(a.max()) for a in imgs)
    assert len(got) == 1, got
    assert got[0].startswith(f"X is floating point with values in [{lo:.4g}, {hi:.4g}];")
    bad = [*imgs[:3], np.full((21, 24, 3), 300, np.int32)]
    with pytest.raises(ValueError, match=r"integer values in \[300, 300\]"):
        RADDetector(extractor="random", image_size=32, k_images=3).fit(bad)
