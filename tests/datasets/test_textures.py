"""Tests of the procedural texture-anomaly generator."""

import numpy as np
import pytest

from mlpapers.datasets import make_texture_anomalies
from mlpapers.datasets._textures import DEFECTS, TEXTURES


def test_shapes_dtypes_and_ranges():
    X_train, X_test, y, mask, t_train, t_test = make_texture_anomalies(
        9, 12, image_size=40, return_texture=True, random_state=0)
    assert X_train.shape == (9, 3, 40, 40) and X_test.shape == (12, 3, 40, 40)
    assert X_train.dtype == X_test.dtype == np.float32
    assert y.dtype == np.int64 and mask.dtype == np.uint8 and mask.shape == (12, 40, 40)
    assert 0 <= X_train.min() and X_train.max() <= 1
    assert y.sum() == 6
    assert np.all(mask[y == 0] == 0)
    assert np.all(mask[y == 1].reshape(6, -1).sum(1) > 0)
    assert set(t_train) == set(range(len(TEXTURES))) and t_test.shape == (12,)


def test_deterministic_and_seed_dependent():
    a = make_texture_anomalies(4, 4, image_size=32, random_state=1)
    b = make_texture_anomalies(4, 4, image_size=32, random_state=1)
    c = make_texture_anomalies(4, 4, image_size=32, random_state=2)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize("defect", DEFECTS)
def test_defect_changes_only_masked_pixels(defect):
    X_train, X_test, y, mask = make_texture_anomalies(
        1, 6, image_size=32, textures=("stripes",), defects=(defect,), anomaly_ratio=1.0,
        noise=0.0, random_state=0)
    assert np.all(y == 1)
    # normal stripes differ only by phase: a defect is a local, masked change
    area = mask.reshape(6, -1).mean(1)
    assert np.all((area > 0.002) & (area < 0.2))


def test_single_texture_normals_are_similar_but_not_identical():
    X, _, _, _ = make_texture_anomalies(3, 1, image_size=32, textures=("grain",),
                                        random_state=0)
    assert not np.allclose(X[0], X[1])
    np.testing.assert_allclose(X[0].mean((1, 2)), X[1].mean((1, 2)), atol=0.08)


@pytest.mark.parametrize("kwargs, match", [
    ({"image_size": 8}, "image_size"),
    ({"textures": ("marble",)}, "textures"),
    ({"defects": ()}, "defects"),
    ({"anomaly_ratio": 1.5}, "anomaly_ratio"),
    ({"noise": -1.0}, "noise"),
    ({"source": "web"}, "source"),
    ({"source": "skimage", "textures": ("stripes",)}, "textures"),
    # a crop larger than the 512x512 photo gave NaN images, not an error
    ({"source": "skimage", "image_size": 513}, "image_size"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_texture_anomalies(2, 2, **kwargs)


def test_skimage_source():
    pytest.importorskip("skimage")
    X_train, X_test, y, mask, t_train, _ = make_texture_anomalies(
        6, 6, image_size=32, source="skimage", noise=0.0, return_texture=True, random_state=0)
    assert X_train.shape == (6, 3, 32, 32) and X_train.dtype == np.float32
    np.testing.assert_array_equal(X_train[:, 0], X_train[:, 1])  # grey on 3 channels
    assert set(t_train) == {0, 1, 2}
    assert not np.allclose(X_train[0], X_train[3])  # different random crops
    assert np.all(mask[y == 1].reshape(int(y.sum()), -1).sum(1) > 0)


@pytest.mark.parametrize("size", [200, 256, 300])
def test_skimage_large_crops_are_random(size):
    # from 256 px on, a 2x crop of the 512 px photo would be the whole photo or one
    # fixed corner: images of one texture must still be different crops
    pytest.importorskip("skimage")
    X, *_ = make_texture_anomalies(3, 0, image_size=size, source="skimage",
                                   textures=("brick",), noise=0.0, random_state=0)
    a, b = X[0, 0].ravel(), X[1, 0].ravel()
    assert np.corrcoef(a, b)[0, 1] < 0.9
