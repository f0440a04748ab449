"""Audit regressions: images as users have them, PyOD habits, memory of the input pipeline."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import erf

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector
from mlpapers.anomaly.rad._images import _validate_images
from mlpapers.datasets import make_texture_anomalies

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def data():
    X_train, X_test, y_test, _ = make_texture_anomalies(
        n_train=10, n_test=8, image_size=32, random_state=0)
    to_u8 = lambda X: (X * 255).round().astype(np.uint8).transpose(0, 2, 3, 1)  # noqa: E731
    return to_u8(X_train), to_u8(X_test), y_test


def _resize_each(images, size):
    """Reference: every image converted to [0, 1] and resized on its own."""
    out = [F.interpolate(torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0)
                         .permute(2, 0, 1)[None], size=size, mode="bilinear",
                         align_corners=False, antialias=True) for im in images]
    return torch.cat(out).numpy()


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_pil_images_of_mixed_sizes_are_resized_to_image_size(data, cls):
    X_train, X_test, _ = data
    sizes = [(32 + 8 * (i % 3), 28 + 4 * (i % 2)) for i in range(len(X_train))]
    pil_train = [PIL.fromarray(a).resize(s) for a, s in zip(X_train, sizes)]
    pil_test = [PIL.fromarray(a).resize(s) for a, s in zip(X_test, sizes[:len(X_test)])]
    kw = dict(extractor="random", image_size=24)
    if cls is RADDetector:
        kw["k_images"] = 4
    else:
        kw["random_state"] = 0
    det = cls(**kw).fit(pil_train)
    ref = cls(**kw).fit(_resize_each(pil_train, (24, 24)))
    np.testing.assert_allclose(det.decision_scores_, ref.decision_scores_, atol=1e-6)
    np.testing.assert_allclose(det.decision_function(pil_test),
                               ref.decision_function(_resize_each(pil_test, (24, 24))),
                               atol=1e-6)
    maps = det.anomaly_map(pil_test)  # one map per image, at that image's size
    assert isinstance(maps, list)
    assert [m.shape for m in maps] == [(h, w) for w, h in (im.size for im in pil_test)]
    with pytest.raises(ValueError, match="set image_size"):
        cls(**{**kw, "image_size": None}).fit(pil_train)


@pytest.mark.parametrize("hw", [(3, 16), (16, 3), (12, 4)])
def test_pil_images_and_files_are_read_as_height_width_channels(data, hw, tmp_path):
    """Regression: decoded PIL images and files, (H, W, C) or (H, W) by construction,
    were stacked and their layout guessed again like an array's, so a colour image 3
    pixels high was read as (C, H, W) (a wrong score and a (1, 16, 3) map) and a
    grayscale image 3 or 4 pixels wide was refused as "a single (H, W, C) image"."""
    det = RADDetector(extractor="random", k_images=2, image_size=16).fit(data[0][:4])
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, hw, dtype=np.uint8)
    PIL.fromarray(rgb).save(tmp_path / "rgb.png")
    PIL.fromarray(gray).save(tmp_path / "gray.png")
    want_rgb = det.decision_function(rgb.transpose(2, 0, 1)[None])  # unambiguous layout
    want_gray = det.decision_function(gray[None, None])
    for given_rgb, given_gray in [([PIL.fromarray(rgb)], [PIL.fromarray(gray)]),
                                  ([tmp_path / "rgb.png"], [tmp_path / "gray.png"])]:
        assert det.anomaly_map(given_rgb).shape == (1, *hw)
        assert det.anomaly_map(given_gray).shape == (1, *hw)
        np.testing.assert_allclose(det.decision_function(given_rgb), want_rgb, rtol=1e-6)
        np.testing.assert_allclose(det.decision_function(given_gray), want_gray, rtol=1e-6)


def test_list_items_of_one_size_in_different_layouts_make_one_batch(data):
    """Regression: RGB next to RGBA, channels-first next to channels-last, or grayscale
    next to channels-first colour were refused as "mixed sizes" (or, with image_size,
    resized one by one and their maps returned as a list)."""
    rgb = data[1][0]                                         # (32, 32, 3) uint8
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])
    gray = rgb[..., 0]
    items = [rgb, rgba, rgb.transpose(2, 0, 1), gray, PIL.fromarray(rgba)]
    from mlpapers.anomaly.rad import check_images
    got = check_images(items)
    want = check_images(np.stack([rgb, rgb, rgb, np.repeat(gray[..., None], 3, -1), rgb]))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    det = RADDetector(extractor="random", k_images=2, image_size=None).fit(data[0][:4])
    maps = det.anomaly_map(items)
    assert isinstance(maps, np.ndarray) and maps.shape == (5, 32, 32)
    np.testing.assert_allclose(maps[1], maps[0], rtol=1e-6)


def test_list_items_are_read_as_the_array_of_the_same_values():
    """Regression (from the review of the per-item layouts): the rows of one (H, W, C)
    image as a list were read as grayscale images; messages show the shapes as given."""
    from mlpapers.anomaly.rad import check_images
    img = np.random.default_rng(0).integers(0, 256, (8, 10, 3), dtype=np.uint8)
    for X in (img, img.tolist(), list(img)):
        with pytest.raises(ValueError, match=r"single \(H, W, C\) colour image"):
            check_images(X)
    with pytest.raises(ValueError, match=r"one image.*shapes \[\(5, 6, 7\), \(6, 7\)\]"):
        check_images([np.zeros((5, 6, 7)), np.zeros((6, 7))])
    with pytest.raises(ValueError, match=r"mixed sizes \[\(3, 8, 9\), \(6, 7, 3\)\]"):
        check_images([np.zeros((3, 8, 9)), np.zeros((6, 7, 3))])


def test_predict_proba_follows_pyod(data):
    X_train, X_test, _ = data
    det = RADDetector(extractor="random", k_images=4, image_size=None).fit(X_train)
    s, tr = det.decision_function(X_test).astype(float), det.decision_scores_.astype(float)
    lin = det.predict_proba(X_test)
    assert lin.shape == (len(X_test), 2) and lin.dtype == np.float64
    np.testing.assert_allclose(lin.sum(1), 1.0)
    np.testing.assert_allclose(lin[:, 1], np.clip((s - tr.min()) / (tr.max() - tr.min()), 0, 1))
    uni = det.predict_proba(X_test, method="unify")
    np.testing.assert_allclose(
        uni[:, 1], np.clip(erf((s - tr.mean()) / (tr.std() * np.sqrt(2))), 0, 1))
    with pytest.raises(ValueError, match="method"):
        det.predict_proba(X_test, method="softmax")


def test_uint8_images_are_converted_batch_by_batch(data):
    X_train = np.ascontiguousarray(data[0])
    t, sizes = _validate_images(X_train)
    # no float copy of the whole input: a uint8 (n, C, H, W) view of the caller's array
    assert t.dtype == torch.uint8 and sizes is None
    assert t.data_ptr() == X_train.ctypes.data
    det = RADDetector(extractor="random", k_images=4, image_size=None, batch_size=3)
    ref = RADDetector(extractor="random", k_images=4, image_size=None, batch_size=3)
    np.testing.assert_allclose(det.fit(X_train).decision_scores_,
                               ref.fit(X_train.astype(np.float32) / 255).decision_scores_,
                               atol=1e-6)


def test_range_warning_points_at_the_callers_line(data):
    X_train, _, _ = data
    X255 = X_train.astype(np.float32)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        det = RADDetector(extractor="random", k_images=2, image_size=None).fit(X255)
        det.decision_function(list(X255[:2]))
    assert len(rec) == 2 and all(w.filename == __file__ for w in rec)


def test_verbose_shows_the_matching_and_coreset_stages(data, capsys):
    X_train, X_test, _ = data
    RADDetector(extractor="random", k_images=2, image_size=None, verbose=1).fit(
        X_train).decision_function(X_test)
    PatchCoreDetector(extractor="random", image_size=None, verbose=1, random_state=0).fit(X_train)
    err = capsys.readouterr().err
    # the extraction bars were the only ones: the matching (the bulk of a large fit) and
    # the coreset selection (PatchCore's) ran without feedback
    for stage in ("RADDetector leave-one-out scores", "RADDetector matching", "greedy coreset"):
        assert stage in err
