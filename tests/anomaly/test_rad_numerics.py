"""RAD at extreme feature scales: cosine matching must not depend on the features' scale."""

import numpy as np
import pytest
import torch

from mlpapers.anomaly.rad import RADDetector, TorchFeatureExtractor
from mlpapers.anomaly.rad._kernels import l2_normalize


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1e-10, 1.0, 1e10, 1e20, 1e30])
def test_l2_normalize_gives_unit_vectors_at_any_scale(dtype, scale):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, 3, generator=g, dtype=torch.float64)
    x[0, 0] = 0.0  # zero vectors stay zero
    expected = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-300)
    got = l2_normalize((x * scale).to(dtype))
    assert torch.isfinite(got).all()
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)
    # on the strided channel axis too (the patch layout the estimator normalises)
    strided = l2_normalize((x * scale).to(dtype).transpose(1, 2), dim=1).transpose(1, 2)
    torch.testing.assert_close(strided.double(), expected, rtol=tol, atol=tol)


class _Scale(torch.nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def _scaled_extractor(scale: float) -> TorchFeatureExtractor:
    """A fixed random conv whose hooked patch features (and key) are multiplied by ``scale``."""
    conv = torch.nn.Conv2d(1, 4, 3, padding=1)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g))
        conv.bias.copy_(torch.randn(conv.bias.shape, generator=g))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.scaled = conv, _Scale(scale)

        def forward(self, x):
            return self.scaled(self.conv(x[:, :1]))

    return TorchFeatureExtractor(Net(), layers=["scaled"], key="gap")


@pytest.mark.parametrize("scale", [1e-22, 1e21])
def test_scores_do_not_depend_on_the_feature_scale(scale):
    # float32 squares of features beyond ~1e19 overflow and below ~1e-19 underflow: the
    # cosines (and so the training images' zero scores) must survive both
    rng = np.random.default_rng(0)
    X = rng.random((6, 16, 16)).astype(np.float32)
    test = X[3:] + 0.2

    def scores(s):
        det = RADDetector(extractor=_scaled_extractor(s), k_images=2, image_size=16).fit(X)
        return det.score_samples(X), det.score_samples(test)

    train_ref, test_ref = scores(1.0)
    train, test_scores = scores(scale)
    assert np.all(train < 1e-5)  # every training image matches itself
    np.testing.assert_allclose(train, train_ref, atol=1e-6)
    np.testing.assert_allclose(test_scores, test_ref, rtol=1e-5, atol=1e-6)


def test_patchcore_rejects_features_whose_distances_overflow():
    # Euclidean distances are not scale-free: features near 1e21 overflow float32
    # squares, which used to give infinite scores; the error names the fix
    from mlpapers.anomaly.rad import PatchCoreDetector

    rng = np.random.default_rng(0)
    X = rng.random((6, 16, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="rescale the extractor's outputs"):
        PatchCoreDetector(extractor=_scaled_extractor(1e21), image_size=16).fit(X)
    # a large but safe scale still works, with finite scores proportional to the scale
    small = PatchCoreDetector(extractor=_scaled_extractor(1.0), image_size=16,
                              random_state=0).fit(X)
    big = PatchCoreDetector(extractor=_scaled_extractor(2.0**40), image_size=16,
                            random_state=0).fit(X)
    np.testing.assert_allclose(big.score_samples(X + 0.2), 2.0**40 * small.score_samples(X + 0.2),
                               rtol=1e-4)


def test_patchcore_rejects_features_whose_distances_underflow():
    # features near 1e-25 gave float32 squared distances below the normal range: every
    # score was exactly 0 (AUROC 0.5) with no warning; the error names the fix, and a
    # small but safe scale keeps scores proportional to the scale
    from mlpapers.anomaly.rad import PatchCoreDetector

    rng = np.random.default_rng(0)
    X = rng.random((6, 16, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="underflow; rescale the extractor's outputs"):
        PatchCoreDetector(extractor=_scaled_extractor(1e-25), image_size=16).fit(X)
    small = PatchCoreDetector(extractor=_scaled_extractor(2.0**-50), image_size=16,
                              random_state=0).fit(X)
    unit = PatchCoreDetector(extractor=_scaled_extractor(1.0), image_size=16,
                             random_state=0).fit(X)
    np.testing.assert_allclose(small.score_samples(X + 0.2),
                               2.0**-50 * unit.score_samples(X + 0.2), rtol=1e-4)
