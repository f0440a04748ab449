"""Paths the rest of the suite did not reach (found by branch coverage): the coreset's
random projection, PatchCore's memory size, boolean images, the extractor wrappers' key
and error paths, the extraction's checks between batches, and scoring without the fitted
feature shapes (files of older versions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
    PatchCoreDetector,
    RADDetector,
    TorchFeatureExtractor,
)
from mlpapers.anomaly.rad._extractors import resolve_extractor
from mlpapers.anomaly.rad._patchcore_kernels import greedy_coreset
from tests.anomaly._fake_vit import FakeViT

X_TRAIN = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(0))
X_TEST = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def _farthest_points(x: np.ndarray, first: int, n: int) -> list[int]:
    """Greedy k-center from its definition, in float64 with explicit distances."""
    sel = [first]
    dmin = np.linalg.norm(x - x[first], axis=1)
    for _ in range(n - 1):
        j = int(np.argmax(dmin))
        sel.append(j)
        dmin = np.minimum(dmin, np.linalg.norm(x - x[j], axis=1))
    return sel


def test_coreset_of_wide_features_is_greedy_k_center_in_the_seeded_projection():
    feats = torch.randn(300, 40, generator=torch.Generator().manual_seed(0))
    sel = greedy_coreset(feats, 12, generator=torch.Generator().manual_seed(5),
                         projection_dim=8)
    g = torch.Generator().manual_seed(5)  # the draws in the kernel's order: projection, start
    proj = torch.randn(40, 8, generator=g, dtype=torch.float32) / math.sqrt(8)
    first = int(torch.randint(300, (1,), generator=g))
    ref = _farthest_points((feats @ proj).double().numpy(), first, 12)
    assert sel.tolist() == ref
    # without the projection (features no wider than projection_dim) another set
    assert greedy_coreset(feats, 12, generator=torch.Generator().manual_seed(5),
                          projection_dim=None).tolist() != ref


def test_patchcore_memory_bytes_is_the_memory_bank_size():
    det = PatchCoreDetector(extractor="random", image_size=None, random_state=0).fit(X_TRAIN)
    assert det.memory_bytes_ == det.memory_.numel() * det.memory_.element_size() > 0


def test_boolean_images_score_as_their_0_1_floats():
    rng = np.random.default_rng(0)
    Xb, Tb = rng.random((4, 3, 16, 16)) > 0.5, rng.random((2, 3, 16, 16)) > 0.5
    a = RADDetector(extractor="random", k_images=2, image_size=None).fit(Xb)
    b = RADDetector(extractor="random", k_images=2, image_size=None).fit(Xb.astype(np.float32))
    np.testing.assert_array_equal(a.decision_function(Tb),
                                  b.decision_function(Tb.astype(np.float32)))


def test_scoring_without_fitted_feature_shapes_is_unchanged():
    det = RADDetector(extractor="random", k_images=2, image_size=None, batch_size=2).fit(X_TRAIN)
    expected = det.decision_function(X_TEST)
    del det.feature_shapes_  # as a detector restored from a file of an older version
    np.testing.assert_array_equal(det.decision_function(X_TEST), expected)


class _Pooled(nn.Module):
    """Conv features and a (B, D) vector output: the key is the vector itself."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 5))

    def forward(self, x):
        return self.head(self.conv(x))


def test_a_vector_output_is_the_key_as_it_is():
    net = _Pooled()
    ext = TorchFeatureExtractor(net, layers=["conv"], mean=None, std=None)
    feats, key = ext(X_TEST)
    with torch.no_grad():
        np.testing.assert_array_equal(key.numpy(), net(X_TEST).numpy())
        np.testing.assert_array_equal(feats[0].numpy(), net.conv(X_TEST).numpy())


def test_a_key_source_of_another_rank_is_refused():
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(0))  # 1-D output
    ext = TorchFeatureExtractor(net, layers=["0"])
    with pytest.raises(ValueError, match=r"cannot make a key from an output of shape \(3072,\)"):
        ext(X_TEST)


def test_extractor_wrapper_parameter_errors():
    with pytest.raises(ValueError, match="at least one submodule"):
        TorchFeatureExtractor(_Pooled(), layers=[])
    for layers in ([], [1.5], [True]):
        with pytest.raises(ValueError, match="non-empty sequence of block indices"):
            DinoViTExtractor(FakeViT(), layers=layers)

    class NoDepth(FakeViT):  # the API, but neither n_blocks nor blocks
        def __init__(self):
            super().__init__()
            self.layers_ = self.blocks
            del self.blocks

    with pytest.raises(ValueError, match="negative layers need a model with n_blocks"):
        DinoViTExtractor(NoDepth(), layers=[-1])
    assert DinoViTExtractor(FakeViT(depth=4), layers=[-1, 1]).layers == [3, 1]


def test_a_vit_that_returns_fewer_layers_is_refused():
    ext = DinoViTExtractor(FakeViT(depth=4), layers=[1, 7])  # block 7 beyond the depth
    with pytest.raises(ValueError, match=r"returned 1 layers for blocks \[1, 7\]"):
        ext(X_TEST)


def test_resolve_extractor_refuses_unknown_names_and_non_callables():
    with pytest.raises(ValueError, match="extractor must be one of"):
        resolve_extractor("resnet")  # (the detectors check the name before, in fit)
    with pytest.raises(TypeError, match="a string, None or a callable, got int"):
        RADDetector(extractor=5, image_size=None).fit(X_TRAIN)


def _features(x, h):
    return [x[:, :2, :h, :h].contiguous()], x.mean(dim=(2, 3))


def test_feature_shapes_that_change_between_batches_are_refused():
    calls = []

    def drifting(x):  # 8x8 maps for the first batch, 4x4 after
        calls.append(1)
        return _features(x, 8 if len(calls) == 1 else 4)

    with pytest.raises(ValueError, match="different shapes for different batches"):
        RADDetector(extractor=drifting, image_size=None, batch_size=2).fit(X_TRAIN)


def test_out_of_memory_in_the_extractor_is_raised_as_it_is():
    def oom(x):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory"):
        RADDetector(extractor=oom, image_size=None).fit(X_TRAIN)


# ---- input errors users hit ------------------------------------------------------------

def test_a_2d_array_of_file_names_is_refused():
    names = np.array([["a.png", "b.png"], ["c.png", "d.png"]])
    with pytest.raises(ValueError, match=r"array of file names of shape \(2, 2\); pass a 1-D"):
        RADDetector(extractor="random", image_size=None).fit(names)


def test_a_batch_inside_a_list_of_images_is_refused_with_image_size():
    items = [np.zeros((2, 16, 16, 3), np.uint8), np.zeros((20, 16, 3), np.uint8)]
    with pytest.raises(ValueError, match=r"each item of X must be one image"):
        RADDetector(extractor="random", image_size=16).fit(items)


def test_images_below_two_pixels_a_side_are_refused():
    with pytest.raises(ValueError, match=r"at least 2x2 pixels, got \(1, 8\)"):
        RADDetector(extractor="random", image_size=None).fit(np.zeros((3, 3, 1, 8)))


@pytest.mark.parametrize("ratio", [0.0, 1.5, "half", float("nan")])
def test_patchcore_coreset_ratio_outside_0_1_is_refused(ratio):
    with pytest.raises(ValueError, match=r"coreset_ratio must be in \(0, 1\]"):
        PatchCoreDetector(extractor="random", image_size=None, coreset_ratio=ratio).fit(X_TRAIN)


@pytest.mark.parametrize("cls, name, match", [
    (PatchCoreDetector, "coreset_ratio", r"coreset_ratio must be in \(0, 1\], got True"),
    (RADDetector, "top_ratio", r"top_ratio must be in \[0, 1\], got True"),
    (RADDetector, "contamination", r"contamination must be in \(0, 0.5\], got True"),
])
def test_a_bool_fraction_is_refused_not_read_as_one(cls, name, match):
    # regression: coreset_ratio=True (meant as "use a coreset") kept the whole memory and
    # top_ratio=True averaged every pixel, silently
    with pytest.raises(ValueError, match=match):
        cls(extractor="random", image_size=None, **{name: True}).fit(X_TRAIN)
