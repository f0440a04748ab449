import pickle

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

from mlpapers._base import TorchEstimatorMixin, load, save

from ._toy import ToyRidge


@parametrize_with_checks([ToyRidge(), ToyRidge(jitter=0.1, random_state=0)])
def test_toy_estimator_passes_sklearn_checks(estimator, check):
    check(estimator)


def _data(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    return X, X @ np.arange(1, d + 1) + 0.1 * rng.standard_normal(n)


def test_fit_returns_self_and_records_n_features():
    X, y = _data()
    est = ToyRidge()
    assert est.fit(X, y) is est
    assert est.n_features_in_ == 3


def test_unfitted_use_raises_not_fitted():
    with pytest.raises(NotFittedError):
        ToyRidge().predict(np.zeros((2, 3)))


def test_wrong_feature_count_names_expected():
    X, y = _data()
    est = ToyRidge().fit(X, y)
    with pytest.raises(ValueError, match="expecting 3 features"):
        est.predict(np.zeros((2, 4)))


def test_tensor_input_gives_numpy_output_equal_to_numpy_input():
    X, y = _data()
    est = ToyRidge().fit(torch.from_numpy(X), y)
    out = est.predict(torch.from_numpy(X))
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, ToyRidge().fit(X, y).predict(X))


def test_random_state_reproducible_and_leaves_global_rng_alone():
    X, y = _data()
    torch.manual_seed(123)
    np.random.seed(123)
    before_t, before_np = torch.random.get_rng_state(), np.random.get_state()[1].copy()
    a = ToyRidge(jitter=1.0, random_state=7).fit(X, y).coef_
    b = ToyRidge(jitter=1.0, random_state=7).fit(X, y).coef_
    c = ToyRidge(jitter=1.0, random_state=8).fit(X, y).coef_
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert torch.equal(before_t, torch.random.get_rng_state())
    np.testing.assert_array_equal(before_np, np.random.get_state()[1])


def test_save_load_round_trip(tmp_path):
    X, y = _data()
    est = ToyRidge(alpha=0.5, jitter=0.2, random_state=3).fit(X, y)
    path = tmp_path / "toy.pt"
    est.save(path)
    back = ToyRidge.load(path)
    assert back.get_params() == est.get_params()
    np.testing.assert_array_equal(back.coef_, est.coef_)
    assert back.history_ == est.history_
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    # the file is readable with the safe loader only
    torch.load(path, weights_only=True)


def test_save_load_continues_the_random_streams(tmp_path):
    X, y = _data()
    est = ToyRidge(jitter=0.2, random_state=3).fit(X, y)
    torch.rand(3, generator=est._torch_gen)  # advance past the seeded start
    est._numpy_gen.random(5)
    est.save(tmp_path / "toy.pt")
    expected_torch = torch.rand(4, generator=est._torch_gen)
    expected_numpy = est._numpy_gen.random(4)
    for loaded in (ToyRidge.load(tmp_path / "toy.pt"), load(tmp_path / "toy.pt", trusted=ToyRidge)):
        torch.testing.assert_close(torch.rand(4, generator=loaded._torch_gen), expected_torch)
        np.testing.assert_array_equal(loaded._numpy_gen.random(4), expected_numpy)


def test_load_of_a_file_without_streams(tmp_path):
    X, y = _data()
    est = ToyRidge(jitter=0.1, random_state=0).fit(X, y)
    est.save(tmp_path / "toy.pt")
    payload = torch.load(tmp_path / "toy.pt", weights_only=True)
    del payload["rng"]  # as written before the streams were saved
    torch.save(payload, tmp_path / "old.pt")
    back = ToyRidge.load(tmp_path / "old.pt")
    assert not hasattr(back, "_torch_gen") and not hasattr(back, "_numpy_gen")
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


@pytest.mark.parametrize("rng", [[1, 2], {"torch": "x"}, {"numpy": {"bit_generator": "MT19937"}},
                                 {"numpy": {"bit_generator": "PCG64", "state": 3}}])
def test_load_rejects_malformed_streams(tmp_path, rng):
    X, y = _data()
    ToyRidge().fit(X, y).save(tmp_path / "toy.pt")
    payload = torch.load(tmp_path / "toy.pt", weights_only=True)
    payload["rng"] = rng
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="generator states are malformed"):
        ToyRidge.load(tmp_path / "bad.pt")


def test_non_pcg_numpy_streams_are_not_saved(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est._numpy_gen = np.random.Generator(np.random.MT19937(0))  # state holds arrays
    est.save(tmp_path / "toy.pt")
    back = ToyRidge.load(tmp_path / "toy.pt")
    assert not hasattr(back, "_numpy_gen") and hasattr(back, "_torch_gen")


class _DroppingGenerator(ToyRidge):
    """Drops a private attribute when pickled, the way several estimators do."""

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_torch_gen", None)
        return state


def test_pickling_leaves_the_estimator_untouched():
    X, y = _data()
    est = _DroppingGenerator(jitter=0.1, random_state=0).fit(X, y)
    back = pickle.loads(pickle.dumps(est))
    assert hasattr(est, "_torch_gen") and not hasattr(back, "_torch_gen")


def test_save_unfitted_raises(tmp_path):
    with pytest.raises(NotFittedError):
        ToyRidge().save(tmp_path / "x.pt")


def test_save_refuses_unsafe_state(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.callback_ = lambda: None
    with pytest.raises(TypeError, match="cannot save"):
        est.save(tmp_path / "x.pt")


def test_load_refuses_foreign_classes_and_other_files(tmp_path):
    X, y = _data()
    path = tmp_path / "toy.pt"
    save(ToyRidge().fit(X, y), path)
    payload = torch.load(path, weights_only=True)
    payload["class"] = "os:system"
    torch.save(payload, path)
    with pytest.raises(ValueError, match="outside mlpapers"):
        load(path)
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not an mlpapers estimator"):
        load(path)


def test_load_checks_the_class(tmp_path):
    class Other(TorchEstimatorMixin):
        pass

    X, y = _data()
    path = tmp_path / "toy.pt"
    ToyRidge().fit(X, y).save(path)
    with pytest.raises(ValueError, match="outside mlpapers"):
        Other.load(path)  # neither an mlpapers class nor the caller's class
    with pytest.raises(ValueError, match="outside mlpapers"):
        load(path)


@pytest.mark.parametrize("labels", [np.array(["cat", "dog"]),
                                    np.array(["cat", 3], dtype=object)])
def test_save_load_string_arrays(tmp_path, labels):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.classes_ = labels
    est.save(tmp_path / "s.pt")
    back = ToyRidge.load(tmp_path / "s.pt")
    assert back.classes_.dtype == labels.dtype
    np.testing.assert_array_equal(back.classes_, labels)


def test_save_refuses_arbitrary_object_arrays(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.things_ = np.array([object()], dtype=object)
    with pytest.raises(TypeError, match="only numbers and strings"):
        est.save(tmp_path / "x.pt")
