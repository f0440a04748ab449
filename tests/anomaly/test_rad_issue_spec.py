"""Issue #7 (anomaly.rad) read literally: names, defaults and the data generator it names.

The method's properties (self-match, brute force, windows, fusion, fp16, layouts, bad input)
are covered against float64 references in test_rad.py and test_rad_properties.py; this file
checks what only the issue text promises.
"""

import inspect

import numpy as np
import pytest
import torch

import mlpapers.anomaly as anomaly
import mlpapers.anomaly.rad as rad
from mlpapers.datasets import make_texture_anomalies


def test_public_names_from_the_module_and_the_package():
    """"Public API (`mlpapers.anomaly.rad`, re-exported from `mlpapers.anomaly`)"."""
    for name in ("RADDetector", "PatchCoreDetector", "TorchFeatureExtractor",
                 "DinoViTExtractor", "RandomConvExtractor"):
        assert getattr(anomaly, name) is getattr(rad, name)


def test_constructor_defaults_are_the_issues():
    """`RADDetector(extractor=None, k_images=150, pos_radius=1, ..., verbose=0)`,
    `PatchCoreDetector(extractor=None, coreset_ratio=0.1, ...)`,
    `TorchFeatureExtractor(module, layers, key="gap"|"cls")`,
    `DinoViTExtractor(model, layers=(3, 6, 9, 11))`."""
    issue = dict(extractor=None, k_images=150, pos_radius=1, layer_weights=None,
                 image_size=224, top_ratio=0.01, smoothing_sigma=1.0, contamination=0.1,
                 memory_dtype="float32", batch_size=16, device="cpu", random_state=None,
                 verbose=0)
    params = inspect.signature(rad.RADDetector).parameters
    assert {k: params[k].default for k in issue} == issue
    params = inspect.signature(rad.PatchCoreDetector).parameters
    assert params["extractor"].default is None and params["coreset_ratio"].default == 0.1
    params = inspect.signature(rad.TorchFeatureExtractor).parameters
    assert list(params)[:3] == ["module", "layers", "key"] and params["key"].default == "gap"
    params = inspect.signature(rad.DinoViTExtractor).parameters
    assert list(params)[:2] == ["model", "layers"]
    assert tuple(params["layers"].default) == (3, 6, 9, 11)
    # called the way the issue writes it: positionally
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, 2, 1), torch.nn.ReLU(),
                              torch.nn.Conv2d(4, 5, 3, 2, 1))
    feats, key = rad.TorchFeatureExtractor(net, ["0", "2"], "gap")(torch.rand(2, 3, 16, 16))
    assert [tuple(f.shape) for f in feats] == [(2, 4, 8, 8), (2, 5, 4, 4)]
    assert tuple(key.shape) == (2, 5)


def test_texture_names_of_the_issue_select_the_scikit_image_photos():
    """"`make_texture_anomalies(...)` ... cut from the bundled scikit-image textures (brick,
    grass, gravel; an optional `data` extra)": the issue's names work without naming the
    source (they raised a ValueError listing the procedural families)."""
    pytest.importorskip("skimage")
    names = ("brick", "grass", "gravel")
    by_name = make_texture_anomalies(6, 6, image_size=32, textures=names, noise=0.0,
                                     return_texture=True, random_state=3)
    explicit = make_texture_anomalies(6, 6, image_size=32, textures=names, source="skimage",
                                      noise=0.0, return_texture=True, random_state=3)
    for a, b in zip(by_name, explicit):
        np.testing.assert_array_equal(a, b)
    X_train = by_name[0]
    np.testing.assert_array_equal(X_train[:, 0], X_train[:, 2])   # grey photos on 3 channels
    assert set(by_name[4].tolist()) == {0, 1, 2}
    # one name, and an iterator (read once)
    one = make_texture_anomalies(2, 2, image_size=16, textures="gravel", random_state=0)
    ref = make_texture_anomalies(2, 2, image_size=16, textures=["gravel"], source="skimage",
                                 random_state=0)
    np.testing.assert_array_equal(one[0], ref[0])
    it = make_texture_anomalies(2, 2, image_size=16, textures=iter(names[:2]),
                                return_texture=True, random_state=0)
    assert it[4].tolist() == [0, 1]


def test_texture_source_defaults_stay_procedural_and_mixed_names_are_refused():
    """The procedural fallback: without names (or with procedural ones) no extra is needed;
    a mix of the two families is a clear error naming both."""
    default = make_texture_anomalies(8, 2, image_size=16, return_texture=True, random_state=1)
    procedural = make_texture_anomalies(8, 2, image_size=16, source="procedural",
                                        return_texture=True, random_state=1)
    for a, b in zip(default, procedural):
        np.testing.assert_array_equal(a, b)
    assert set(default[4].tolist()) == {0, 1, 2, 3}            # the four procedural families
    with pytest.raises(ValueError, match=r"(?s)'stripes'.*'brick'"):
        make_texture_anomalies(2, 2, textures=("brick", "stripes"))
    with pytest.raises(ValueError, match="source"):
        make_texture_anomalies(2, 2, source="photos")


@pytest.mark.parametrize("empty", [[], (), np.array([], dtype=object)],
                         ids=["list", "tuple", "object-array"])
def test_empty_fit_set_is_a_clear_error(empty):
    """"bad input (... empty fit set) raises clear errors": an empty list of images said
    "Expected 3D or 4D array for X, got 1D array instead"."""
    for det in (rad.RADDetector(extractor="random"), rad.PatchCoreDetector(extractor="random")):
        with pytest.raises(ValueError, match="X holds no images"):
            det.fit(empty)
    with pytest.raises(ValueError, match="0 sample"):       # an empty array: sklearn's wording
        rad.RADDetector(extractor="random").fit(np.zeros((0, 3, 16, 16), np.float32))
