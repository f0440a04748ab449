"""save/load with states torch cannot hold, and files that are not what save wrote.

Found by the persistence probe: ``save`` failed with torch's raw "can't convert
np.ndarray of type numpy.longdouble" when a state or parameter held long doubles
(``classes_`` of labels given as ``np.longdouble``); ``load`` of an empty, truncated or
random file raised torch's EOFError/RuntimeError/UnpicklingError (the last advising
``weights_only=False``, wrong for a loader meant for untrusted files); a file with a
damaged attribute name loaded and failed at ``predict`` with an AttributeError; and
``map_location="meta"`` reported a valid file as "not a valid mlpapers estimator file".
"""

import pickle
import warnings

import numpy as np
import pytest
import torch

from mlpapers.datasets import make_federated_linear
from mlpapers.federated import CLoVE
from mlpapers.optim.scent import KLDROClassifier
from tests._toy import ToyRidge


def _data(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return X, X @ np.arange(1, d + 1) + 0.1 * rng.standard_normal(n)


def _saved_toy(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    path = tmp_path / "m.pt"
    est.save(path)
    return est, path, X


# -- long doubles -------------------------------------------------------------------
def test_long_double_labels_round_trip_exactly(tmp_path):
    X, y = _data()
    big = np.longdouble(2) ** 60  # labels float64 would round to one value
    labels = np.where(y > 0, big + 1, big + 3)
    est = KLDROClassifier(epochs=1, init="zeros", random_state=0).fit(X, labels)
    assert est.classes_.dtype == np.longdouble
    est.save(tmp_path / "m.pt")
    back = KLDROClassifier.load(tmp_path / "m.pt")
    assert back.classes_.dtype == np.longdouble
    np.testing.assert_array_equal(back.classes_, [big + 1, big + 3])
    got, want = back.predict(X), est.predict(X)
    assert got.dtype == want.dtype == np.longdouble
    np.testing.assert_array_equal(got, want)


def test_clove_with_long_double_labels_saves_and_predicts_the_same(tmp_path):
    clients, _, _ = make_federated_linear(n_clusters=2, n_clients_per_cluster=2, n_samples=20,
                                          n_features=3, random_state=0)
    clients = [(x, (y > 0).astype(np.longdouble)) for x, y in clients]
    est = CLoVE(n_clusters=2, model="logistic", n_rounds=1, random_state=0).fit(clients)
    est.save(tmp_path / "m.pt")
    back = CLoVE.load(tmp_path / "m.pt")
    X0 = clients[0][0]
    np.testing.assert_array_equal(back.predict(X0, client=0), est.predict(X0, client=0))
    np.testing.assert_array_equal(back.classes_, est.classes_)


def test_a_long_double_parameter_saves_and_loads_unchanged(tmp_path):
    X, y = _data()
    est = ToyRidge(alpha=np.longdouble(1) / 3).fit(X, y)
    est.save(tmp_path / "m.pt")
    back = ToyRidge.load(tmp_path / "m.pt")
    assert type(back.alpha) is np.longdouble and back.alpha == est.alpha
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


@pytest.mark.parametrize("value", [np.longdouble(1) / 3, np.clongdouble(1) / 3 + 1j,
                                   np.longdouble("-0.0"), np.ulonglong(2 ** 64 - 1)],
                         ids=["longdouble", "clongdouble", "negative zero", "ulonglong"])
def test_numpy_scalars_torch_cannot_hold_keep_type_and_value(tmp_path, value):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.extra_ = value
    est.save(tmp_path / "m.pt")
    got = ToyRidge.load(tmp_path / "m.pt").extra_
    assert got.dtype == value.dtype and got == value  # (ulonglong loads as its uint64)
    assert np.signbit(got.real) == np.signbit(value.real)


def test_long_double_arrays_keep_shape_infinities_and_nan(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    arr = np.array([[1, np.inf], [-np.inf, np.nan], [-0.0, 2]], dtype=np.longdouble).T / 7
    est.extra_ = arr
    est.save(tmp_path / "m.pt")
    got = ToyRidge.load(tmp_path / "m.pt").extra_
    assert got.dtype == np.longdouble and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(arr))


# -- files that are not what save wrote ---------------------------------------------
def _contents(good):
    rng = np.random.default_rng(0)
    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "random bytes": rng.integers(0, 256, 500, dtype=np.uint8).tobytes(),
        "text": b"hello world\n" * 10,
        "pickle": pickle.dumps(ToyRidge()),
    }


@pytest.mark.parametrize("kind", ["empty", "truncated", "random bytes", "text", "pickle"])
def test_load_of_a_file_save_did_not_write_is_a_value_error_naming_it(tmp_path, kind):
    # (and no torch warning first: a plain pickle warned "Detected pickle protocol 4 in
    # the checkpoint ... please file an issue" before the error)
    _, path, _ = _saved_toy(tmp_path)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(_contents(path.read_bytes())[kind])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="not a valid mlpapers estimator file") as info:
            ToyRidge.load(bad)
    assert str(bad) in str(info.value)
    assert "weights_only" not in str(info.value)
    if kind == "pickle":
        assert "pickle.load" in str(info.value)


def test_a_zip_archive_torch_cannot_read_keeps_torchs_detail(tmp_path):
    import zipfile

    bad = tmp_path / "bad.pt"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("x.txt", "not a torch file")
    with pytest.raises(ValueError, match="not a valid mlpapers estimator file") as info:
        ToyRidge.load(bad)
    assert info.value.__cause__ is not None  # torch's detail stays in the chain


def test_damaged_generator_state_and_type_tags_are_value_errors_at_load(tmp_path):
    # numpy's state setter raised OverflowError for an out-of-range integer, and an
    # unknown "__mlpapers_*" tag loaded as a plain dict that failed at predict
    est, path, X = _saved_toy(tmp_path)
    est._numpy_gen = np.random.default_rng(0)  # saved with the generator states
    est.save(path)
    payload = torch.load(path, weights_only=True)
    state = payload["rng"]["numpy"]["__mlpapers_numpy_rng__"]["state"]
    for bad_value in (-1, 2**200):
        state["state"] = bad_value
        torch.save(payload, tmp_path / "rng.pt")
        with pytest.raises(ValueError, match="rng.pt.*not a valid.*generator states"):
            ToyRidge.load(tmp_path / "rng.pt")
    payload = torch.load(path, weights_only=True)
    coef = payload["state"]["coef_"]
    assert set(coef) == {"__mlpapers_ndarray__"}
    payload["state"]["coef_"] = {"__mlpapers_ndarrax__": coef["__mlpapers_ndarray__"]}
    torch.save(payload, tmp_path / "tag.pt")
    with pytest.raises(ValueError, match="tag.pt.*not a valid.*__mlpapers_ndarrax__"):
        ToyRidge.load(tmp_path / "tag.pt")


def test_paths_as_bytes_and_bad_destinations(tmp_path):
    est, path, X = _saved_toy(tmp_path)
    target = tmp_path / "b.pt"
    est.save(bytes(target))  # as open() takes them; torch.save and torch.load do not
    np.testing.assert_array_equal(ToyRidge.load(bytes(target)).predict(X), est.predict(X))
    with pytest.raises(IsADirectoryError):
        est.save(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        est.save(tmp_path / "no" / "m.pt")
    with pytest.raises(TypeError, match="path must be a str or path-like"):
        est.save(3)
    from mlpapers.optim.scent import KLDRORegressor

    KLDRORegressor(epochs=1, random_state=0).fit(*_data()).save(target)
    with pytest.raises(TypeError, match=r"holds a saved KLDRORegressor, not KLDROClassifier; "
                                        r"load it with KLDRORegressor.load"):
        KLDROClassifier.load(target)


def test_a_missing_file_stays_file_not_found_and_an_empty_one_is_a_value_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        ToyRidge.load(tmp_path / "missing.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty.pt.* is not a valid mlpapers estimator file"):
        ToyRidge.load(tmp_path / "empty.pt")


@pytest.mark.parametrize("edit", ["renamed", "deleted"])
def test_load_of_a_damaged_attribute_name_fails_on_load_not_on_predict(tmp_path, edit):
    est, path, X = _saved_toy(tmp_path)
    payload = torch.load(path, weights_only=True)
    old = {k: v for k, v in payload.items() if k != "names"}  # as older versions wrote
    torch.save(old, tmp_path / "old.pt")  # (no names to check: loads as before)
    np.testing.assert_array_equal(ToyRidge.load(tmp_path / "old.pt").predict(X), est.predict(X))
    coef = payload["state"].pop("coef_")
    if edit == "renamed":
        payload["state"]["coeff_"] = coef
    torch.save(payload, path)
    with pytest.raises(ValueError, match="not a valid mlpapers estimator file.*coef"):
        ToyRidge.load(path)


def test_a_byte_flipped_attribute_name_fails_on_load(tmp_path):
    _, path, _ = _saved_toy(tmp_path)
    data = bytearray(path.read_bytes())
    at = data.find(b"coef_")
    data[at + 1] = ord("x")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not a valid mlpapers estimator file"):
        ToyRidge.load(path)


@pytest.mark.parametrize("map_location", ["meta", torch.device("meta"),
                                          {"cpu": "meta"}],
                         ids=["str", "device", "dict"])
def test_load_to_the_meta_device_says_so(tmp_path, map_location):
    _, path, _ = _saved_toy(tmp_path)
    with pytest.raises(ValueError, match="meta") as info:
        ToyRidge.load(path, map_location=map_location)
    assert "not a valid mlpapers estimator file" not in str(info.value)


def test_load_to_a_device_name_that_is_unusable_blames_map_location(tmp_path):
    _, path, _ = _saved_toy(tmp_path)
    with pytest.raises(ValueError, match="map_location='nowhere'"):
        ToyRidge.load(path, map_location="nowhere")


def test_a_file_that_cannot_be_opened_keeps_its_os_error(tmp_path, monkeypatch):
    # zipfile.is_zipfile(path) swallowed the PermissionError: "not the zip archive"
    import builtins

    _, path, _ = _saved_toy(tmp_path)
    real_open = builtins.open

    def refusing_open(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing_open)
    with pytest.raises(PermissionError):
        ToyRidge.load(path)
