"""New-user regressions: image files in a folder, saving a detector with your own backbone."""

import os
import re

import numpy as np
import pytest
import torch

from mlpapers.anomaly.rad import PatchCoreDetector, RADDetector, TorchFeatureExtractor
from mlpapers.datasets import make_texture_anomalies

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def photos():
    """uint8 RGB photos of three different sizes, and their files in a folder."""
    X, _, _, _ = make_texture_anomalies(n_train=6, n_test=2, image_size=40, random_state=0)
    u8 = (X * 255).round().astype(np.uint8).transpose(0, 2, 3, 1)
    return [u8[i, : 30 + 5 * (i % 3), : 40 - 3 * (i % 2)].copy() for i in range(len(u8))]


@pytest.fixture(scope="module")
def folder(photos, tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    for i, im in enumerate(photos):
        PIL.fromarray(im).save(root / f"{i}.png")
    return root


def _extractor():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 16, 3, 2, 1), torch.nn.ReLU())
    return TorchFeatureExtractor(net, layers=["1", "3"], mean=None, std=None)


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_a_list_of_image_files_is_read_like_the_arrays(photos, folder, cls):
    paths = sorted(folder.glob("*.png"), key=lambda p: int(p.stem))
    ref = cls(extractor="random", image_size=32, random_state=0).fit(photos)
    for X in (paths, [str(p) for p in paths], np.array([str(p) for p in paths])):
        det = cls(extractor="random", image_size=32, random_state=0).fit(X)
        np.testing.assert_array_equal(det.decision_scores_, ref.decision_scores_)
    maps = det.anomaly_map(paths[:2])
    assert [m.shape for m in maps] == [p.shape[:2] for p in photos[:2]]
    # an object array of images (e.g. a pandas column of arrays), as a list
    column = np.empty(len(photos), dtype=object)
    column[:] = photos
    det = cls(extractor="random", image_size=32, random_state=0).fit(column)
    np.testing.assert_array_equal(det.decision_scores_, ref.decision_scores_)
    # file names as bytes, and a pandas Series of paths with pandas' default dtype
    names = [str(p) for p in paths]
    for X in ([os.fsencode(p) for p in names], np.array(names, dtype="S")):
        det = cls(extractor="random", image_size=32, random_state=0).fit(X)
        np.testing.assert_array_equal(det.decision_scores_, ref.decision_scores_)
    pd = pytest.importorskip("pandas")
    det = cls(extractor="random", image_size=32, random_state=0).fit(pd.Series(names))
    np.testing.assert_array_equal(det.decision_scores_, ref.decision_scores_)


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_image_files_are_decoded_one_batch_at_a_time(photos, folder, tmp_path, monkeypatch,
                                                     cls):
    """A call on a folder of files decoded all of them before the first batch."""
    from mlpapers.anomaly.rad import _common, _images

    same = tmp_path / "same"
    same.mkdir()
    for i, im in enumerate(photos):
        PIL.fromarray(im[:30, :37]).save(same / f"{i}.png")
    decoded, at_batch = [], []
    read, resize = _images._read_image_file, _common._resize
    monkeypatch.setattr(_images, "_read_image_file",
                        lambda path, name: decoded.append(path) or read(path, name))
    # the extraction resizes each batch once: how many files were decoded by then
    monkeypatch.setattr(_common, "_resize",
                        lambda x, size: at_batch.append(len(decoded)) or resize(x, size))
    for root, arrays in ((folder, photos), (same, [im[:30, :37] for im in photos])):
        paths = sorted(root.glob("*.png"), key=lambda p: int(p.stem))
        ref = cls(extractor="random", image_size=32, batch_size=2, random_state=0).fit(arrays)
        decoded.clear()
        at_batch.clear()
        det = cls(extractor="random", image_size=32, batch_size=2, random_state=0).fit(paths)
        assert at_batch == [2, 4, 6] and len(decoded) == len(paths)
        np.testing.assert_array_equal(det.decision_scores_, ref.decision_scores_)
        maps, scores = det.anomaly_map(paths, return_scores=True)
        ref_maps, ref_scores = ref.anomaly_map(arrays, return_scores=True)
        np.testing.assert_array_equal(scores, ref_scores)
        assert type(maps) is type(ref_maps)  # one array for one size, else a list
        for m, r in zip(maps, ref_maps):
            np.testing.assert_array_equal(m, r)
        assert det.n_features_in_ == ref.n_features_in_


def test_a_missing_file_fails_before_any_batch(photos, folder, monkeypatch):
    from mlpapers.anomaly.rad import _images

    paths = sorted(folder.glob("*.png")) + [folder / "missing.png"]
    monkeypatch.setattr(_images, "_read_image_file", lambda *a: pytest.fail("decoded"))
    with pytest.raises(FileNotFoundError, match="missing.png"):
        RADDetector(extractor="random", image_size=32, batch_size=2).fit(paths)


def test_a_single_folder_path_says_how_to_list_the_files(folder):
    for X in (folder, str(folder)):
        with pytest.raises(TypeError, match="list of image files"):
            RADDetector(extractor="random", image_size=32).fit(X)


@pytest.mark.parametrize("cls", [RADDetector, PatchCoreDetector])
def test_save_load_with_a_custom_extractor(photos, tmp_path, cls):
    ext = _extractor()
    det = cls(extractor=ext, image_size=32, k_images=3, random_state=0) if cls is RADDetector \
        else cls(extractor=ext, image_size=32, random_state=0)
    det.fit(photos)
    assert det.feature_shapes_ == [(8, 16, 16), (16, 8, 8)]
    det.save(tmp_path / "det.pt")
    assert det.extractor is ext  # the marker is only in the file
    with pytest.raises(ValueError, match="extractor=my_extractor"):
        cls.load(tmp_path / "det.pt")
    loaded = cls.load(tmp_path / "det.pt", extractor=_extractor())
    np.testing.assert_array_equal(loaded.decision_function(photos),
                                  det.decision_function(photos))
    # another backbone cannot silently score against this memory
    other = TorchFeatureExtractor(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1)), layers=["0"])
    with pytest.raises(ValueError, match="memory was built from maps"):
        cls.load(tmp_path / "det.pt", extractor=other).decision_function(photos)
    if cls is RADDetector:  # same maps but keys of another dimension: a clear error too
        keyed = TorchFeatureExtractor(ext.module, layers=["1", "3"], key_layer="1",
                                      mean=None, std=None)
        with pytest.raises(ValueError, match="keys of dimension"):
            cls.load(tmp_path / "det.pt", extractor=keyed).decision_function(photos)
    # the generic loader cannot restore the module: scoring says how to load it
    from mlpapers._base import load
    with pytest.raises(ValueError, match="extractor=my_extractor"):
        load(tmp_path / "det.pt").decision_function(photos)
    # a built-in extractor is rebuilt: passing one is a mistake
    cls(extractor="random", image_size=32).fit(photos).save(tmp_path / "builtin.pt")
    with pytest.raises(ValueError, match="rebuilt on load"):
        cls.load(tmp_path / "builtin.pt", extractor=ext)


@pytest.mark.parametrize("shape, hint", [((20, 64), "X.reshape(20, 8, 8)"),
                                         ((20, 48), "X.reshape(20, 4, 4, 3)"),
                                         ((20, 48), "X.reshape(20, 3, 4, 4)"),
                                         ((20, 10), "X.reshape(n, H, W)")])
def test_a_table_of_flattened_images_gets_the_reshape_to_apply(shape, hint):
    # PyOD users pass (n_samples, n_features) tables, e.g. load_digits().data
    X = np.random.default_rng(0).random(shape)
    for data in (X, torch.from_numpy(X), X.tolist()):
        with pytest.raises(ValueError, match=re.escape(hint)):
            RADDetector(extractor="random", image_size=16).fit(data)


def test_float_files_warn_once_per_call_not_once_per_batch(tmp_path):
    for i in range(4):  # float ("F") images with values up to 3: outside [0, 1]
        im = (np.random.default_rng(i).random((20, 20)) * 3).astype(np.float32)
        PIL.fromarray(im, mode="F").save(tmp_path / f"{i}.tif")
    paths = sorted(tmp_path.glob("*.tif"))
    with pytest.warns(UserWarning, match="float images are expected in") as record:
        RADDetector(extractor="random", image_size=32, batch_size=2).fit(paths)
    assert len([w for w in record if "float images" in str(w.message)]) == 1
