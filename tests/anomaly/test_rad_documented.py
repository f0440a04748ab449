"""What the detectors' and extractors' docstrings promise (session 15, API contract).

Each test checks one sentence of a public docstring against the code: the labels that
``score`` accepts, the leave-one-out labels of ``fit_predict``, the feature shapes of
``RandomConvExtractor``, what ``check_images`` returns, and the ``mean``/``std``
normalisation of the extractors.
"""

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
    PatchCoreDetector,
    RADDetector,
    RandomConvExtractor,
    TorchFeatureExtractor,
    check_images,
)
from mlpapers.datasets import make_texture_anomalies

from ._fake_vit import FakeViT


@pytest.fixture(scope="module")
def textures():
    return make_texture_anomalies(n_train=8, n_test=6, image_size=32, random_state=0)


class _CountingExtractor:
    """The random extractor, counting the images it is given."""

    def __init__(self):
        self.net = RandomConvExtractor()
        self.seen = 0

    def __call__(self, images):
        self.seen += len(images)
        return self.net(images)


@pytest.mark.parametrize("y", [
    np.zeros(6), np.ones(6, dtype=bool),        # one class: the AUROC is undefined
    np.array([-1, 1, -1, 1, -1, 1]),             # scikit-learn's outlier labels
    np.array([0, 2, 0, 2, 0, 2]),                # not binary 0/1
    np.array([[0, 1, 0, 1, 0, 1]]),              # not 1D
])
@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_score_refuses_labels_that_are_not_both_binary_classes_before_scoring(
        cls, y, textures):
    X_train, X_test, _, _ = textures
    ext = _CountingExtractor()
    det = cls(extractor=ext, image_size=None).fit(X_train)
    seen = ext.seen
    # scikit-learn >= 1.8 returned NaN (with a warning) for one class, and labels in
    # {-1, 1} gave an AUROC with the wrong positive class for sklearn's convention
    with pytest.raises(ValueError, match="y must be a 1D array of binary labels"):
        det.score(X_test, y)
    assert ext.seen == seen  # raised before any test image was extracted


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_score_is_the_auroc_of_decision_function_for_int_float_and_bool_labels(
        cls, textures):
    X_train, X_test, y, _ = textures
    det = cls(extractor="random", image_size=None, random_state=0).fit(X_train)
    expected = roc_auc_score(y, det.decision_function(X_test))
    for labels in (y, y.astype(float), y.astype(bool), list(y)):
        assert det.score(X_test, labels) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_fit_predict_labels_the_leave_one_out_scores(cls, textures):
    X_train = textures[0]
    det = cls(extractor="random", image_size=None, coreset_ratio=1.0, contamination=0.2) \
        if cls is PatchCoreDetector else cls(extractor="random", image_size=None,
                                             contamination=0.2)
    labels = det.fit_predict(X_train)
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels, det.labels_)
    np.testing.assert_array_equal(labels, det.decision_scores_ > det.threshold_)
    assert labels.sum() >= 1  # a 0.2 quantile of 8 distinct scores leaves one above
    # predict scores each training image with itself in the memory: about 0, normal
    assert det.predict(X_train).sum() == 0


@pytest.mark.parametrize("size", [(32, 32), (33, 17), (7, 5)])
def test_random_conv_extractor_shapes_are_as_documented(size):
    channels = (4, 6, 5)
    ext = RandomConvExtractor(channels=channels, seed=3)
    feats, key = ext(torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(0)))
    for s, (f, c) in enumerate(zip(feats, channels)):
        assert tuple(f.shape) == (2, c, *(math.ceil(n / 2 ** (s + 1)) for n in size))
    assert tuple(key.shape) == (2, 2 * channels[-1])


def test_check_images_returns_contiguous_float32_rgb_in_unit_range():
    gray = np.arange(2 * 5 * 6, dtype=np.uint8).reshape(2, 5, 6) * 4
    out = check_images(gray)
    assert out.dtype == torch.float32 and out.is_contiguous()
    assert tuple(out.shape) == (2, 3, 5, 6)
    np.testing.assert_allclose(out.numpy(), np.repeat(gray[:, None] / 255.0, 3, axis=1),
                               rtol=0, atol=1e-7)
    x = torch.rand(2, 3, 5, 4)
    assert check_images(x).data_ptr() == x.data_ptr()  # returned itself, not a copy


@pytest.mark.parametrize("kw, match", [
    (dict(std=None), "std is None but mean"),                 # used to fail at the call
    (dict(std=(0.2, 0.0, 0.2)), "std must be"),               # used to give inf features
    (dict(std=-1.0, mean=0.5), "std must be"),
    (dict(mean=(0.5, 0.5)), "mean must be"),                  # two values for RGB
    (dict(mean=(float("nan"),) * 3), "mean must be"),
    (dict(mean="imagenet"), "mean must be"),
])
@pytest.mark.parametrize("make", [
    lambda **kw: TorchFeatureExtractor(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), ["0"],
                                       **kw),
    lambda **kw: DinoViTExtractor(FakeViT(), layers=(1, 3), **kw),
], ids=["torch", "dino"])
def test_extractors_refuse_a_normalisation_they_cannot_apply(make, kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)


def test_mean_none_skips_the_normalisation_whatever_std():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    plain = TorchFeatureExtractor(net, ["0"], mean=None, std=None)(x)[0][0]
    for std in (None, (0.5, 0.5, 0.5)):
        torch.testing.assert_close(TorchFeatureExtractor(net, ["0"], mean=None, std=std)(x)[0][0],
                                   plain, rtol=0, atol=0)
    # and given values are applied as (x - mean) / std
    scaled = TorchFeatureExtractor(net, ["0"], mean=0.25, std=0.5)(x)[0][0]
    torch.testing.assert_close(scaled, net((x - 0.25) / 0.5), rtol=1e-6, atol=1e-6)
