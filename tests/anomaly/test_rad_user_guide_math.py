"""The math of ``docs/user_guide/rad.rst`` that no other test checks against an
independent reference (the RAD pipeline itself is checked against a float64 reference
in ``test_rad_properties.py``)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mlpapers.anomaly.rad import PatchCoreDetector

_G = torch.Generator().manual_seed(0)
_K1 = torch.randn(6, 3, 3, 3, generator=_G, dtype=torch.float64)
_K2 = torch.randn(5, 6, 3, 3, generator=_G, dtype=torch.float64)


def _features64(x):
    """Two layers on different grids (stride 2 and 4) and a key, in float64."""
    a = torch.relu(F.conv2d(x.double(), _K1, stride=2, padding=1))
    b = torch.tanh(F.conv2d(a, _K2, stride=2, padding=1))
    return [a, b], b.mean((2, 3))


def _extractor(x):
    maps, key = _features64(x)
    return [m.float() for m in maps], key.float()


def _gaussian_blur(S, sigma):
    """Normalised 2D Gaussian of 2 ceil(2 sigma) + 1 taps, zero padding."""
    half = math.ceil(2 * sigma)
    t = np.arange(-half, half + 1)
    g = np.exp(-(t**2) / (2 * sigma**2))
    g /= g.sum()
    kernel = torch.tensor(np.outer(g, g))[None, None]
    return F.conv2d(S[:, None], kernel, padding=half)[:, 0]


@pytest.mark.parametrize("sigma", [4.0, 1.5])
def test_patchcore_map_and_score_match_the_page(sigma):
    """Section "Choices", PatchCore: each layer 3x3-averaged (``count_include_pad=False``),
    resized bilinearly to the first layer's grid, concatenated; with the full memory
    (``coreset_ratio=1``) the image score is the maximum nearest-patch Euclidean distance
    on the grid, and the map is those distances upsampled bilinearly to the input size
    and blurred with a Gaussian of ``2 ceil(2 sigma) + 1`` taps and zero padding."""
    rng = np.random.default_rng(2)
    X_train = rng.random((6, 3, 20, 28)).astype(np.float32)
    X_test = rng.random((3, 3, 20, 28)).astype(np.float32)

    def embed(X):
        maps, _ = _features64(torch.from_numpy(X))
        grid = maps[0].shape[-2:]
        return torch.cat([F.interpolate(F.avg_pool2d(m, 3, 1, 1, count_include_pad=False),
                                        size=grid, mode="bilinear", align_corners=False)
                          for m in maps], 1)

    e_tr, e_te = embed(X_train), embed(X_test)
    mem = e_tr.permute(0, 2, 3, 1).reshape(-1, e_tr.shape[1])
    queries = e_te.permute(0, 2, 3, 1).reshape(len(X_test), -1, e_te.shape[1])
    dist = torch.cdist(queries, mem[None].expand(len(X_test), -1, -1)).amin(-1)
    dist = dist.reshape(len(X_test), *e_te.shape[-2:])
    want_map = _gaussian_blur(F.interpolate(dist[:, None], size=X_test.shape[-2:],
                                            mode="bilinear", align_corners=False)[:, 0],
                              sigma)
    det = PatchCoreDetector(extractor=_extractor, coreset_ratio=1.0, image_size=None,
                            smoothing_sigma=sigma, random_state=0).fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    np.testing.assert_allclose(maps, want_map.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores, dist.flatten(1).amax(1).numpy(), rtol=1e-5, atol=1e-6)
    assert np.all(scores >= maps.reshape(len(maps), -1).max(1) - 1e-6)
