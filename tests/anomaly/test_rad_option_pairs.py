"""Option interactions of RADDetector and PatchCoreDetector: a pairwise covering array.

Every pair of values of every two code-path options appears in at least one
configuration (a greedy covering array, generated deterministically below). Each
configuration checks what every option promises alone: numpy scores of the right
shape, maps whose image scores are ``decision_function``'s, training images scoring
0, pickle and save/load giving the same scores, every ``matching`` kernel and every
``batch_size``/``chunk_size`` giving the same scores (to float rounding), a radius
covering the grid equal to ``pos_radius=None``, ``k_images >= n_train`` equal to
``n_train``, and a half-precision memory close to float32. Plus the regressions found
by this audit.
"""

import pickle
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import clone

from mlpapers.anomaly.rad import (
    PatchCoreDetector,
    RADDetector,
    RandomConvExtractor,
    TorchFeatureExtractor,
)
from tests._pairwise import covering_array, uncovered_pairs

N_TRAIN = 5
_rng = np.random.default_rng(0)
X_TRAIN = _rng.random((N_TRAIN, 16, 16, 3)).astype(np.float32)
X_TEST = _rng.random((2, 16, 16, 3)).astype(np.float32)
X_TEST[0, 5:9, 5:9] = 1.0  # a bright square



def _net() -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):  # seeded weights, global RNG untouched
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
                                   torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 12, 3, stride=2, padding=1))


NET = _net()


def pooled(x):  # a plain function extractor: two pooled grids and a mean key
    pool = torch.nn.functional.avg_pool2d
    return [pool(x, 2), pool(x, 4) * 2 - 1], x.mean((2, 3))


EXTRACTORS = {"random": lambda: "random",
              # conv outputs, not ReLUs: no all-zero patch (which scores 1 even in memory)
              "torch": lambda: TorchFeatureExtractor(NET, layers=["0", "2"]),
              "function": lambda: pooled}
OPTIONS = {
    "extractor": list(EXTRACTORS),
    "k_images": [1, 3, 50],
    "pos_radius": [None, 0, 1, 40],
    "layer_weights": [None, [1.0, 0.0], [0.2, 0.8]],
    "image_size": [None, (16, 24)],
    "top_ratio": [0.0, 0.05, 1.0],
    "smoothing_sigma": [0.0, 1.0],
    "blur_padding": ["zeros", "reflect"],
    "memory_dtype": ["float32", "float16", "bfloat16"],
    "matching": ["auto", "shared", "tiled", "gather"],
    "batch_size": [1, 16],
    "chunk_size": [2048, 2**24],
    "input": ["nhwc", "list", "uint8"],
}
CONFIGS = covering_array(OPTIONS, seed=3, n_candidates=25)
TRAIN_TOL = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 2e-2}  # the documented rounding


def images(kind, X):
    if kind == "list":
        return list(X)
    if kind == "uint8":
        return (X * 255).round().astype(np.uint8)
    return X


def build(c, **over):
    params = {k: v for k, v in c.items() if k not in ("extractor", "input")}
    params.update(over)
    return RADDetector(extractor=EXTRACTORS[c["extractor"]](), **params)


def test_covering_array_covers_every_pair():
    assert uncovered_pairs(OPTIONS, CONFIGS) == []


@pytest.mark.parametrize("c", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_rad_option_pairs(c, tmp_path):
    X_tr, X_te = images(c["input"], X_TRAIN), images(c["input"], X_TEST)
    det = build(c).fit(X_tr)
    scores = det.decision_function(X_te)
    assert isinstance(scores, np.ndarray) and scores.shape == (2,)
    assert np.isfinite(scores).all()
    maps, again = det.anomaly_map(X_te, return_scores=True)
    assert maps.shape == (2, 16, 16) and np.isfinite(maps).all()
    np.testing.assert_array_equal(again, scores)
    assert det.decision_scores_.shape == (N_TRAIN,) and det.labels_.shape == (N_TRAIN,)
    # an image of the memory retrieves itself: score 0 up to the memory dtype's rounding
    assert np.abs(det.decision_function(X_tr)).max() < TRAIN_TOL[c["memory_dtype"]]
    # pickle and save/load give the same scores
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(det)).decision_function(X_te),
                                  scores)
    det.save(tmp_path / "rad.pt")
    ext = None if isinstance(det.extractor, str) else det.extractor
    loaded = RADDetector.load(tmp_path / "rad.pt", extractor=ext)
    np.testing.assert_array_equal(loaded.decision_function(X_te), scores)
    np.testing.assert_array_equal(loaded.decision_scores_, det.decision_scores_)

    def rescored(**params):  # the scores with these parameters changed (only)
        if "memory_dtype" in params:  # a storage parameter: refit
            return clone(det).set_params(**params).fit(X_tr).decision_function(X_te)
        old = {k: loaded.get_params()[k] for k in params}
        try:  # scoring parameters are read again when scoring
            return loaded.set_params(**params).decision_function(X_te)
        finally:
            loaded.set_params(**old)

    # every matching kernel and any batch/chunk sizes: the same scores to rounding
    for matching in {"auto", "shared", "tiled", "gather"} - {c["matching"]}:
        np.testing.assert_allclose(rescored(matching=matching), scores, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(rescored(batch_size=2, chunk_size=500), scores,
                               rtol=1e-4, atol=2e-5)
    if c["pos_radius"] == 40:  # a window covering every grid: no positional prior
        np.testing.assert_allclose(rescored(pos_radius=None), scores, rtol=1e-4, atol=2e-5)
    if c["k_images"] > N_TRAIN:  # clamped to the memory size
        np.testing.assert_array_equal(rescored(k_images=N_TRAIN), scores)
    if c["memory_dtype"] != "float32":  # half precision stays close to float32
        np.testing.assert_allclose(rescored(memory_dtype="float32"), scores,
                                   atol=3 * TRAIN_TOL[c["memory_dtype"]])


PATCHCORE_OPTIONS = {
    "extractor": list(EXTRACTORS),
    "coreset_ratio": [1.0, 0.3, 1e-6],
    "image_size": [None, (16, 24)],
    "smoothing_sigma": [0.0, 4.0],
    "memory_dtype": ["float32", "float16", "bfloat16"],
    "chunk_size": [50, 2**24],
    "input": ["nhwc", "list", "uint8"],
}
PATCHCORE_CONFIGS = covering_array(PATCHCORE_OPTIONS, seed=4, n_candidates=25)


@pytest.mark.parametrize("c", PATCHCORE_CONFIGS,
                         ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_patchcore_option_pairs(c):
    X_tr, X_te = images(c["input"], X_TRAIN), images(c["input"], X_TEST)
    params = {k: v for k, v in c.items() if k not in ("extractor", "input")}
    det = PatchCoreDetector(extractor=EXTRACTORS[c["extractor"]](), random_state=0,
                            **params).fit(X_tr)
    scores = det.decision_function(X_te)
    assert scores.shape == (2,) and np.isfinite(scores).all()
    maps, again = det.anomaly_map(X_te, return_scores=True)
    assert maps.shape == (2, 16, 16)
    np.testing.assert_array_equal(again, scores)
    np.testing.assert_array_equal(clone(det).fit(X_tr).decision_function(X_te), scores)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(det)).decision_function(X_te),
                                  scores)
    det.set_params(batch_size=2, chunk_size=37)
    np.testing.assert_allclose(det.decision_function(X_te), scores, rtol=1e-5, atol=1e-4)


# -- regressions ----------------------------------------------------------------------

@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_extractor_set_after_fit_is_the_one_that_scores(cls, tmp_path):
    """set_params(extractor=...) after fit used to be ignored (the cached extractor kept
    scoring) while a pickled or loaded copy scored with the new one; now all three
    score with the parameter, and another feature shape raises as documented."""
    det = cls(extractor="random", image_size=None).fit(X_TRAIN)
    before = det.decision_function(X_TEST)
    other = RandomConvExtractor(seed=3)  # the same feature shapes, other weights
    det.set_params(extractor=other)
    after = det.decision_function(X_TEST)
    assert not np.array_equal(after, before)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(det)).decision_function(X_TEST),
                                  after)
    det.save(tmp_path / "det.pt")
    np.testing.assert_array_equal(
        cls.load(tmp_path / "det.pt", extractor=other).decision_function(X_TEST), after)
    det.set_params(extractor=RandomConvExtractor(channels=(8, 16)))
    with pytest.raises(ValueError, match="memory was built from maps of shapes"):
        det.decision_function(X_TEST)
    det.set_params(extractor="random")  # back to the fitted one: its scores again
    np.testing.assert_array_equal(det.decision_function(X_TEST), before)


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_image_size_set_after_fit_names_image_size(cls):
    """image_size changed after fit: the error used to blame the images (of the right
    size) and call image_size None; it now names image_size and the fitted size."""
    det = cls(extractor="random", image_size=None).fit(X_TRAIN)
    det.set_params(image_size=24)
    with pytest.raises(ValueError, match=r"image_size=24 but the memory was built at the "
                                         r"network input size \(16, 16\)"):
        det.decision_function(X_TEST)
    det.set_params(image_size=(16, 16))  # the fitted size, written out: fine
    assert det.decision_function(X_TEST).shape == (2,)
    det.set_params(image_size=None)
    with pytest.raises(ValueError, match=r"X images are \(12, 12\) but the memory was built "
                                         r"from \(16, 16\) images \(image_size=None\)"):
        det.decision_function(X_TEST[:, :12, :12])


LOO_TOL = {"float32": 1e-5, "float16": 5e-4, "bfloat16": 3e-3}  # documented rounding


@pytest.mark.parametrize("c", [dict(c, input="nhwc") for c in  # one per memory dtype
                               {c["memory_dtype"]: c for c in CONFIGS}.values()],
                         ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_leave_one_out_scores_are_fits_without_the_image(c):
    """decision_scores_[i] is the score of image i against a detector fitted on the
    others, whatever the options (to the memory dtype's rounding, user guide)."""
    det = build(c).fit(X_TRAIN)
    loo = [build(c).fit(np.delete(X_TRAIN, i, 0)).decision_function(X_TRAIN[i:i + 1])[0]
           for i in range(N_TRAIN)]
    np.testing.assert_allclose(loo, det.decision_scores_, rtol=0,
                               atol=LOO_TOL[c["memory_dtype"]])


def test_patchcore_covering_array_covers_every_pair():
    assert uncovered_pairs(PATCHCORE_OPTIONS, PATCHCORE_CONFIGS) == []


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_a_single_training_image_warns_where_a_threshold_is_read(cls):
    # one image has no other to be scored against: scores 0 and threshold 0 flag every
    # test image with a positive score, which predict used to do silently; one-shot
    # ranking with decision_function (the paper's setting) stays quiet
    det = cls(extractor="random", image_size=None, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        det.fit(X_TRAIN[:1])
        det.decision_function(X_TEST)
    assert det.decision_scores_.tolist() == [0.0] and det.threshold_ == 0.0
    for method in ("predict", "predict_proba"):
        with pytest.warns(UserWarning, match=f"single image.*so {method} has no threshold"):
            getattr(det, method)(X_TEST)
    two = cls(extractor="random", image_size=None, random_state=0).fit(X_TRAIN[:2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        two.predict(X_TEST)
        two.predict_proba(X_TEST)
