"""Tests of RADDetector and PatchCoreDetector (torch-only: random-conv extractor)."""

import pickle

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.metrics import roc_auc_score

from mlpapers.anomaly import PatchCoreDetector, RADDetector, RandomConvExtractor
from mlpapers.anomaly.rad import check_images
from mlpapers.datasets import make_texture_anomalies


class PixelExtractor(torch.nn.Module):
    """Full-resolution features (a fixed 1x1 conv): maps need no resizing."""

    def __init__(self, channels=6):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.weight = torch.randn(channels, 3, 1, 1, generator=g)

    def forward(self, x):
        f = torch.nn.functional.conv2d(x - 0.5, self.weight)
        return [f], f.mean(dim=(2, 3))


class FirstLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = RandomConvExtractor()

    def forward(self, x):
        feats, key = self.inner(x)
        return feats[:1], key


@pytest.fixture(scope="module")
def textures():
    return make_texture_anomalies(24, 24, image_size=32, random_state=0)


@pytest.fixture(scope="module")
def fitted(textures):
    X_train = textures[0]
    return RADDetector(extractor="random", k_images=8, image_size=None).fit(X_train)


def _patches(extractor, X):
    f = extractor(torch.as_tensor(X))[0][0]
    f = f.flatten(2).transpose(1, 2)
    return f / f.norm(dim=2, keepdim=True)


def test_training_images_score_zero(fitted, textures):
    maps, scores = fitted.anomaly_map(textures[0][:5], return_scores=True)
    np.testing.assert_allclose(maps, 0.0, atol=1e-5)
    np.testing.assert_allclose(scores, 0.0, atol=1e-5)
    assert np.all(fitted.decision_scores_ > 0)  # leave-one-out training scores


def test_pasted_defect_raises_score_and_map_peaks_inside(fitted, textures):
    X_train = textures[0]
    X = X_train[:4].copy()
    mask = np.zeros((32, 32), bool)
    mask[12:19, 10:17] = True
    X_def = X.copy()
    X_def[:, :, mask] = np.array([1.0, 0.0, 1.0])[None, :, None]
    base = fitted.decision_function(X)
    maps, scores = fitted.anomaly_map(X_def, return_scores=True)
    assert np.all(scores > base + 0.05)
    for m in maps:
        assert mask.ravel()[np.argmax(m)]


def test_synthetic_auroc_random_extractor():
    X_train, X_test, y, mask = make_texture_anomalies(32, 32, image_size=48, random_state=0)
    det = RADDetector(extractor="random", k_images=10, image_size=None).fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    # Over data seeds 1-20 the image AUROC of this setting has mean 0.90, sd 0.05 and
    # minimum 0.80 (2 of 20 below the former 0.85, which seed 0 passed by luck); the
    # bound is mean - 3 sd. The pixel AUROC is stable (min 0.93 over the same seeds).
    assert roc_auc_score(y, scores) >= 0.75
    assert roc_auc_score(mask.ravel(), maps.ravel()) >= 0.85
    assert det.score(X_test, y) == pytest.approx(roc_auc_score(y, scores))


def test_global_matching_equals_brute_force_nearest_patch(textures):
    X_train, X_test = textures[0][:6], textures[1][:5]
    ext = PixelExtractor()
    det = RADDetector(extractor=ext, k_images=6, pos_radius=None, image_size=None,
                      smoothing_sigma=0.0, top_ratio=0.0).fit(X_train)
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    q, m = _patches(ext, X_test), _patches(ext, X_train).reshape(-1, 6)
    ref = (1 - (q @ m.T).amax(2)).clamp_min(0).reshape(5, 32, 32).numpy()
    np.testing.assert_allclose(maps, ref, atol=1e-5)
    np.testing.assert_allclose(scores, ref.reshape(5, -1).max(1), atol=1e-5)
    # k larger than the memory is clamped
    det_big = RADDetector(extractor=ext, k_images=1000, pos_radius=None, image_size=None,
                          smoothing_sigma=0.0, top_ratio=0.0).fit(X_train)
    np.testing.assert_allclose(det_big.decision_function(X_test), scores, atol=1e-6)


def test_radius_zero_equals_same_position_matching(textures):
    X_train, X_test = textures[0][:6], textures[1][:5]
    ext = PixelExtractor()
    det = RADDetector(extractor=ext, k_images=6, pos_radius=0, image_size=None,
                      smoothing_sigma=0.0).fit(X_train)
    maps = det.anomaly_map(X_test)
    q, m = _patches(ext, X_test), _patches(ext, X_train)
    ref = 1 - torch.einsum("blc,nlc->bnl", q, m).amax(1)
    np.testing.assert_allclose(maps, ref.clamp_min(0).reshape(5, 32, 32).numpy(), atol=1e-5)


def test_chunked_equals_unchunked_and_batch_size_invariance(textures):
    X_train, X_test = textures[0][:8], textures[1][:4]
    ref = RADDetector(extractor="random", k_images=3, image_size=None).fit(X_train)
    maps = ref.anomaly_map(X_test)
    for matching in ("tiled", "gather"):
        small = RADDetector(extractor="random", k_images=3, image_size=None, chunk_size=20000,
                            batch_size=3, matching=matching).fit(X_train)
        np.testing.assert_allclose(small.anomaly_map(X_test), maps, atol=1e-5)
        np.testing.assert_allclose(small.decision_scores_, ref.decision_scores_, atol=1e-5)


def test_fp16_memory_keeps_auroc(textures):
    X_train, X_test, y, _ = textures
    full = RADDetector(extractor="random", k_images=8, image_size=None).fit(X_train)
    half = RADDetector(extractor="random", k_images=8, image_size=None,
                       memory_dtype="float16").fit(X_train)
    assert half.memory_[0].dtype == torch.float16
    assert half.memory_bytes_ < 0.6 * full.memory_bytes_
    assert abs(full.score(X_test, y) - half.score(X_test, y)) <= 0.01
    np.testing.assert_allclose(half.decision_function(X_train[:3]), 0.0, atol=2e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_memory_is_cast_per_batch_and_equals_the_float32_memory_cast(textures, dtype):
    X_train = textures[0]
    full = RADDetector(extractor="random", k_images=4, image_size=None, batch_size=3
                       ).fit(X_train)
    half = RADDetector(extractor="random", k_images=4, image_size=None, batch_size=3,
                       memory_dtype=dtype).fit(X_train)
    assert half.grid_shapes_ == full.grid_shapes_
    for h, f in zip(half.memory_, full.memory_):
        assert h.dtype == getattr(torch, dtype) and h.is_contiguous()
        assert torch.equal(h, f.to(h.dtype))
    # the fit keeps each batch only in the stored form: extraction with the fit's
    # per-batch store returns the memory itself, never the float32 maps of all images
    images, _ = half._images(X_train)
    patches, keys = half._extract(images, "fit", store=half._fit_store())
    assert [p.dtype for p in patches] == [getattr(torch, dtype)] * len(half.memory_)
    for p, m in zip(patches, half.memory_):
        assert torch.equal(p, m)
    assert torch.equal(keys, half.keys_)


def test_one_hot_layer_weights_equal_single_layer(textures):
    X_train, X_test = textures[0], textures[1]
    both = RADDetector(extractor="random", k_images=5, image_size=None,
                       layer_weights=[2.0, 0.0]).fit(X_train)
    single = RADDetector(extractor=FirstLayer(), k_images=5, image_size=None).fit(X_train)
    np.testing.assert_allclose(both.anomaly_map(X_test), single.anomaly_map(X_test), atol=1e-6)
    np.testing.assert_allclose(both.layer_weights_, [1.0, 0.0])


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "gray", "gray4", "uint8", "tensor", "pil"])
def test_input_layouts(fitted, textures, layout):
    X = textures[1][:3]
    ref = fitted.decision_function(np.ascontiguousarray(X))
    if layout == "nhwc":
        Xin = X.transpose(0, 2, 3, 1)
    elif layout == "gray":
        Xin, ref = X[:, 0], None
    elif layout == "gray4":
        Xin, ref = X[:, :1], None
    elif layout == "uint8":
        Xin = np.round(X * 255).astype(np.uint8)
    elif layout == "tensor":
        Xin = torch.from_numpy(X)
    elif layout == "pil":
        from PIL import Image

        Xin = [Image.fromarray(np.round(x.transpose(1, 2, 0) * 255).astype(np.uint8)) for x in X]
    else:
        Xin = X
    maps, scores = fitted.anomaly_map(Xin, return_scores=True)
    assert maps.shape == (3, 32, 32) and scores.shape == (3,)
    assert np.all(np.isfinite(scores))
    if ref is not None:
        np.testing.assert_allclose(scores, ref, atol=0.02 if layout in ("uint8", "pil") else 1e-6)
    assert set(fitted.predict(Xin)) <= {0, 1}


def test_check_images_grayscale_repeats_channels():
    t = check_images(np.random.default_rng(0).random((2, 5, 7)))
    assert t.shape == (2, 3, 5, 7)
    assert torch.equal(t[:, 0], t[:, 2])


def test_non_square_images_and_resizing():
    rng = np.random.default_rng(0)
    X = rng.random((6, 3, 24, 40)).astype(np.float32)
    det = RADDetector(extractor="random", k_images=3, image_size=None).fit(X)
    assert det.grid_shapes_ == [(12, 20), (6, 10)]
    assert det.anomaly_map(X[:2]).shape == (2, 24, 40)
    det2 = RADDetector(extractor="random", k_images=3, image_size=(16, 32)).fit(X)
    assert det2.anomaly_map(rng.random((2, 3, 30, 50))).shape == (2, 30, 50)
    with pytest.raises(ValueError, match="image_size=None"):
        det.decision_function(rng.random((2, 3, 24, 24)))


def test_pyod_api(fitted, textures):
    X_train, X_test, y, _ = textures
    assert fitted.decision_scores_.shape == (len(X_train),)
    assert fitted.threshold_ == pytest.approx(np.percentile(fitted.decision_scores_, 90))
    np.testing.assert_array_equal(fitted.labels_,
                                  (fitted.decision_scores_ > fitted.threshold_).astype(int))
    pred = fitted.predict(X_test)
    np.testing.assert_array_equal(pred, fitted.decision_function(X_test) > fitted.threshold_)
    np.testing.assert_array_equal(fitted.score_samples(X_test), fitted.decision_function(X_test))
    assert fitted.n_train_ == len(X_train) and fitted.n_features_in_ == 3 * 32 * 32


def test_one_shot_memory(textures):
    X_train, X_test, y, _ = textures
    det = RADDetector(extractor="random", k_images=150, image_size=None).fit(X_train[:1])
    np.testing.assert_array_equal(det.decision_scores_, [0.0])
    assert np.all(np.isfinite(det.decision_function(X_test)))


def test_save_load_and_pickle_round_trip(fitted, textures, tmp_path):
    X_test = textures[1]
    ref = fitted.anomaly_map(X_test)
    fitted.save(tmp_path / "rad.pt")
    loaded = RADDetector.load(tmp_path / "rad.pt")
    np.testing.assert_array_equal(loaded.anomaly_map(X_test), ref)
    assert loaded.threshold_ == fitted.threshold_
    clone = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(clone.anomaly_map(X_test), ref)
    # a custom extractor is not stored: load needs it again (tests/anomaly/test_rad_usability.py)
    custom = RADDetector(extractor=PixelExtractor(), image_size=None).fit(textures[0][:3])
    custom.save(tmp_path / "custom.pt")
    with pytest.raises(ValueError, match="custom extractor"):
        RADDetector.load(tmp_path / "custom.pt")


def test_determinism_and_verbose(textures, capsys):
    X_train, X_test = textures[0][:8], textures[1][:4]
    a = RADDetector(extractor="random", k_images=3, image_size=None, verbose=1).fit(X_train)
    b = RADDetector(extractor="random", k_images=3, image_size=None).fit(X_train[::-1].copy())
    np.testing.assert_allclose(a.decision_function(X_test), b.decision_function(X_test),
                               atol=1e-6)


@pytest.mark.parametrize("make_X, match", [
    (lambda X: X[:, :2], "1, 3 or 4 channels"),
    (lambda X: np.where(np.arange(X.size).reshape(X.shape) == 5, np.nan, X), "NaN"),
    (lambda X: [X[0], X[1, :, :16]], "mixed sizes"),
    (lambda X: X[:0], "minimum of 1"),
    (lambda X: X[0, 0, 0], "3D or 4D"),
    (lambda X: X[0, 0], r"For a single image pass X\[None\]"),
])
def test_bad_inputs(textures, make_X, match):
    with pytest.raises(ValueError, match=match):
        RADDetector(extractor="random", image_size=None).fit(make_X(textures[0][:4]))


@pytest.mark.parametrize("params, err, match", [
    ({"k_images": 0}, ValueError, "k_images"),
    ({"k_images": 1.5}, TypeError, "k_images"),
    ({"pos_radius": -1}, ValueError, "pos_radius"),
    ({"top_ratio": 2.0}, ValueError, "top_ratio"),
    ({"contamination": 0.7}, ValueError, "contamination"),
    ({"memory_dtype": "int8"}, ValueError, "memory_dtype"),
    ({"extractor": "resnet"}, ValueError, "extractor"),
    ({"layer_weights": [-1, 1]}, ValueError, "layer_weights"),
    ({"layer_weights": [1, 1, 1]}, ValueError, "layer_weights"),
    ({"layer_weights": "bogus"}, ValueError, "layer_weights"),
    ({"layer_weights": [[1], [1, 2]]}, ValueError, "layer_weights"),
    # RAD draws no random numbers, but refuses a seed the other estimators refuse
    ({"random_state": "bogus"}, TypeError, "random_state"),
    ({"random_state": -1}, ValueError, "random_state"),
    ({"image_size": (3,)}, ValueError, "image_size"),
    ({"blur_padding": "wrap"}, ValueError, "blur_padding"),
    ({"matching": "loop"}, ValueError, "matching"),
])
def test_bad_params(textures, params, err, match):
    with pytest.raises(err, match=match):
        RADDetector(**{"extractor": "random", "image_size": None, **params}).fit(
            textures[0][:4])


def test_not_fitted():
    with pytest.raises(NotFittedError):
        RADDetector(extractor="random").decision_function(np.zeros((1, 3, 8, 8)))
    with pytest.raises(NotFittedError):
        PatchCoreDetector(extractor="random").anomaly_map(np.zeros((1, 3, 8, 8)))


# -- PatchCore baseline ---------------------------------------------------------
def test_patchcore_full_memory_equals_brute_force(textures):
    X_train, X_test = textures[0][:5], textures[1][:4]
    det = PatchCoreDetector(extractor="random", coreset_ratio=1.0, image_size=None,
                            smoothing_sigma=0.0).fit(X_train)
    ext = RandomConvExtractor()
    with torch.no_grad():
        emb_tr = det._embed(ext(torch.from_numpy(X_train))[0]).reshape(-1, 96)
        emb_te = det._embed(ext(torch.from_numpy(X_test))[0])
    ref = torch.cdist(emb_te.double(), emb_tr.double()[None]).amin(2).amax(1)
    np.testing.assert_allclose(det.decision_function(X_test), ref.numpy(), rtol=1e-4, atol=1e-4)
    assert det.memory_.shape == (5 * 16 * 16, 96)


def test_patchcore_coreset_and_auroc():
    # 64 test images: with the 24 of the fixture the AUROC was too noisy for a bound
    # (0.75 failed for 6 of 20 data seeds). Over seeds 0-19 this setting gives mean 0.80,
    # sd 0.06, min 0.69 (the full memory gives the same: the coreset is not the cause);
    # 0.65 is below mean - 2 sd and 2 null sd above chance (0.5).
    X_train, X_test, y, _ = make_texture_anomalies(24, 64, image_size=32, random_state=0)
    det = PatchCoreDetector(extractor="random", coreset_ratio=0.1, image_size=None,
                            random_state=0).fit(X_train)
    assert det.memory_.shape[0] == int(np.ceil(0.1 * len(X_train) * 256))
    maps, scores = det.anomaly_map(X_test, return_scores=True)
    assert maps.shape == (len(X_test), 32, 32)
    assert roc_auc_score(y, scores) >= 0.65
    assert np.all(det.decision_scores_ > 0)
    again = PatchCoreDetector(extractor="random", coreset_ratio=0.1, image_size=None,
                              random_state=0).fit(X_train)
    assert torch.equal(det.memory_, again.memory_)  # random_state determinism


def test_patchcore_save_load(textures, tmp_path):
    det = PatchCoreDetector(extractor="random", coreset_ratio=0.5, image_size=None,
                            random_state=0, memory_dtype="float16").fit(textures[0][:6])
    det.save(tmp_path / "pc.pt")
    loaded = PatchCoreDetector.load(tmp_path / "pc.pt")
    np.testing.assert_array_equal(loaded.decision_function(textures[1]),
                                  det.decision_function(textures[1]))


def test_estimator_check_instances_are_empty():
    assert RADDetector._estimator_check_instances() == []
    assert PatchCoreDetector._estimator_check_instances() == []


# -- audit regressions: inputs made elsewhere -------------------------------------
def test_integer_pixels_of_any_dtype_equal_uint8(fitted, textures):
    """int64 / int32 / nested lists of 0..255 pixel values are 8-bit images, like uint8."""
    X8 = np.round(textures[1][:3] * 255).astype(np.uint8)
    ref = fitted.decision_function(X8)
    for Xin in (X8.astype(np.int64), X8.astype(np.int32), X8.tolist(),
                torch.from_numpy(X8.astype(np.int16))):
        np.testing.assert_array_equal(fitted.decision_function(Xin), ref)
    np.testing.assert_allclose(fitted.decision_function(X8 / 255.0), ref, atol=1e-6)
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        check_images(X8.astype(np.int64) * 2)
    with pytest.raises(ValueError, match=r"\[0, 255\]"):
        check_images(-X8.astype(np.int64))
    # unsigned 16/32-bit (torch has no CPU min/max kernel for them): checked, not a crash
    for dtype in (np.uint16, np.uint32):
        torch.testing.assert_close(check_images(X8.astype(dtype)), check_images(X8))
        with pytest.raises(ValueError, match=r"\[0, 255\]"):
            check_images(X8.astype(dtype) * 257)
    torch.testing.assert_close(check_images(torch.from_numpy(X8).to(torch.uint16)),
                               check_images(X8))
    with pytest.raises(ValueError, match=r"18446744073709551615\]"):  # no wrap-around
        check_images(np.full((1, 4, 4), 2**64 - 1, dtype=np.uint64))


def test_float_pixels_out_of_range_warn(textures):
    with pytest.warns(UserWarning, match=r"expected in \[0, 1\]"):
        check_images(textures[1][:2] * 255.0)
    with pytest.warns(UserWarning, match=r"expected in \[0, 1\]"):
        check_images((textures[1][:2] - 0.45) / 0.22)  # ImageNet-normalised by mistake


def test_rgba_drops_alpha_like_pil(fitted, textures):
    X = textures[1][:3]
    alpha = np.full_like(X[:, :1], 0.3)
    ref = fitted.decision_function(X)
    np.testing.assert_array_equal(fitted.decision_function(np.concatenate([X, alpha], 1)), ref)
    nhwc = np.concatenate([X, alpha], 1).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(fitted.decision_function(nhwc), ref)


@pytest.mark.parametrize("extractor, match", [
    (lambda x: ([x], x.mean((2, 3))[:1]), "key has shape"),
    (lambda x: ([x[:1]], x.mean((2, 3))), "feature map 0 has shape"),
    (lambda x: ([x.mean((2, 3))], x.mean((2, 3))), "feature map 0 has shape"),
    (lambda x: ([x * torch.nan], x.mean((2, 3))), "NaN"),
])
def test_bad_extractor_output_is_a_clear_error(textures, extractor, match):
    for cls in (RADDetector, PatchCoreDetector):
        with pytest.raises(ValueError, match=match):
            cls(extractor=extractor, image_size=None, batch_size=2).fit(textures[0][:4])
    with pytest.raises(TypeError, match="extractor must return"):
        RADDetector(extractor=lambda x: (x, x.mean((2, 3))), image_size=None).fit(
            textures[0][:4])


def test_params_changed_after_fit_are_validated(fitted, textures):
    bad = pickle.loads(pickle.dumps(fitted)).set_params(pos_radius=-1)
    with pytest.raises(ValueError, match="pos_radius"):
        bad.decision_function(textures[1][:2])


def test_images_too_small_for_the_backbone_name_image_size(textures):
    """A backbone that cannot run at the input size gives a ValueError, not a torch trace."""
    class Valid5x5(torch.nn.Module):  # unpadded 5x5 conv twice: needs >= 9x9 inputs
        def forward(self, x):
            conv = torch.nn.functional.conv2d
            f = conv(conv(x, torch.ones(4, 3, 5, 5) / 75), torch.ones(4, 4, 5, 5) / 100)
            return [f], f.mean(dim=(2, 3))

    X = textures[0][:3, :, :8, :8]
    with pytest.raises(ValueError, match="image_size"):
        RADDetector(extractor=Valid5x5(), image_size=None).fit(X)
    det = RADDetector(extractor=Valid5x5(), image_size=16, k_images=2).fit(X)
    assert det.anomaly_map(X).shape == (3, 8, 8)


def test_list_mixing_grayscale_and_colour_images(fitted, textures):
    from PIL import Image

    X8 = np.round(textures[1][:2] * 255).astype(np.uint8).transpose(0, 2, 3, 1)
    gray, colour = Image.fromarray(X8[0, :, :, 0]), Image.fromarray(X8[1])
    mixed = fitted.decision_function([gray, colour])
    np.testing.assert_allclose(mixed, np.r_[fitted.decision_function([gray]),
                                            fitted.decision_function([colour])], atol=1e-6)


def test_user_extractor_layouts_and_float64_range():
    # a user extractor may return strided maps (here channels-last views) or float64 maps;
    # fit normalises exactly what scoring sees (contiguous float32), and float64 values
    # beyond the float32 range are caught as infinite, not stored as NaN memory
    rng = np.random.default_rng(0)
    X = rng.random((6, 3, 8, 8)).astype(np.float32)

    def plain(x):
        f = torch.nn.functional.avg_pool2d(x, 2)
        return [f], f.mean((2, 3))

    def strided(x):
        f = torch.nn.functional.avg_pool2d(x, 2)
        return [f.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)], f.mean((2, 3))

    kw = dict(k_images=3, image_size=None, batch_size=4)
    a = RADDetector(extractor=plain, **kw).fit(X)
    b = RADDetector(extractor=strided, **kw).fit(X)
    assert not strided(torch.as_tensor(X))[0][0].is_contiguous()
    torch.testing.assert_close(a.memory_[0], b.memory_[0], rtol=0, atol=0)
    np.testing.assert_array_equal(a.decision_scores_, b.decision_scores_)
    with pytest.raises(ValueError, match="infinite"):
        RADDetector(extractor=lambda x: ([plain(x)[0][0].double() * 1e39], x.mean((2, 3))),
                    **kw).fit(X)
