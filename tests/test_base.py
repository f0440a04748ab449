import pickle

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator
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
                                 {"numpy": {"bit_generator": "PCG64", "state": 3}},
                                 {"numpy": 3}, {"numpy": {"bit_generator": "Unknown"}}])
def test_load_rejects_malformed_streams(tmp_path, rng):
    X, y = _data()
    ToyRidge().fit(X, y).save(tmp_path / "toy.pt")
    payload = torch.load(tmp_path / "toy.pt", weights_only=True)
    payload["rng"] = rng
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="generator states are malformed"):
        ToyRidge.load(tmp_path / "bad.pt")


@pytest.mark.parametrize("bit_gen", ["MT19937", "PCG64", "Philox", "SFC64"])
def test_numpy_streams_of_every_bit_generator_continue_after_load(tmp_path, bit_gen):
    """Only PCG64 streams used to be saved (the others' states hold arrays)."""
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est._numpy_gen = np.random.Generator(getattr(np.random, bit_gen)(0))
    est._numpy_gen.random(3)
    est.save(tmp_path / "toy.pt")
    expected = est._numpy_gen.random(4)
    np.testing.assert_array_equal(ToyRidge.load(tmp_path / "toy.pt")._numpy_gen.random(4),
                                  expected)


def test_files_with_a_plain_pcg64_state_dict_still_load(tmp_path):
    """Files written before the streams went through the state encoder."""
    X, y = _data()
    est = ToyRidge(random_state=0).fit(X, y)
    est.save(tmp_path / "toy.pt")
    payload = torch.load(tmp_path / "toy.pt", weights_only=True)
    payload["rng"]["numpy"] = est._numpy_gen.bit_generator.state  # the old layout
    torch.save(payload, tmp_path / "old.pt")
    expected = est._numpy_gen.random(4)
    np.testing.assert_array_equal(ToyRidge.load(tmp_path / "old.pt")._numpy_gen.random(4),
                                  expected)


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


def test_save_load_dict_keys_of_every_supported_kind(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.table_ = {None: 1, "a": 2, 3: 3, 1.5: 4, True: 5, (np.int64(2), "b"): 6}
    est.save(tmp_path / "k.pt")
    back = ToyRidge.load(tmp_path / "k.pt").table_
    assert back == {None: 1, "a": 2, 3: 3, 1.5: 4, True: 5, (2, "b"): 6}
    assert [type(k) for k in back] == [type(None), str, int, float, bool, tuple]
    assert type(list(back)[-1][0]) is int  # the numpy scalar in the tuple, as a Python int
    est.table_ = {object(): 1}
    with pytest.raises(TypeError, match="dict keys of type object"):
        est.save(tmp_path / "bad.pt")


def test_save_refuses_arbitrary_object_arrays(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.things_ = np.array([object()], dtype=object)
    with pytest.raises(TypeError, match="only numbers and strings"):
        est.save(tmp_path / "x.pt")


# -- regressions of the fifth-session audit -------------------------------------
def test_tensor_x_validates_y_like_an_array():
    """With tensor X, a column-vector y was kept 2-D (coef_ became a matrix) and
    NaN in y passed silently; the array path ravels/rejects them."""
    import warnings

    from sklearn.exceptions import DataConversionWarning

    X, y = _data()
    ref = ToyRidge().fit(X, y).coef_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataConversionWarning)
        est = ToyRidge().fit(torch.from_numpy(X), torch.from_numpy(y)[:, None])
    np.testing.assert_allclose(est.coef_, ref)
    y_nan = y.copy()
    y_nan[0] = np.nan
    with pytest.raises(ValueError, match="y contains NaN"):
        ToyRidge().fit(torch.from_numpy(X), torch.from_numpy(y_nan))
    # tensors with grad as y next to numpy X (np.asarray cannot read them)
    est = ToyRidge().fit(X, torch.from_numpy(y).requires_grad_())
    np.testing.assert_allclose(est.coef_, ref)


def test_tensor_input_after_a_dataframe_fit_warns_like_arrays():
    pd = pytest.importorskip("pandas")
    X, y = _data()
    est = ToyRidge().fit(pd.DataFrame(X, columns=["a", "b", "c"]), y)
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        est.predict(torch.from_numpy(X))
    est.fit(torch.from_numpy(X), y)
    assert not hasattr(est, "feature_names_in_")


def test_save_load_keeps_array_shapes_dtypes_and_numpy_scalars(tmp_path):
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.scalar_arr_ = np.array(3.5)  # was loaded with shape (1,)
    est.threshold_ = np.float32(0.25)  # was loaded as a Python float
    est.count_ = np.int64(7)
    est.complex_ = np.array([1 + 2j])
    est.labels_ = np.array(["a", "bb"], dtype="<U10")  # was loaded as <U2
    est.no_labels_ = np.empty((0, 2), dtype="<U5")  # was loaded as float64 of shape (0,)
    est.mixed_ = np.array([np.int64(3), "a"], dtype=object)  # was unreadable
    est.by_key_ = {np.int64(1): "x"}  # was written but unreadable
    est.tagged_ = {"__mlpapers_tuple__": [1, 2]}  # was loaded as a tuple
    est.save(tmp_path / "s.pt")
    back = ToyRidge.load(tmp_path / "s.pt")
    assert back.scalar_arr_.shape == () and back.scalar_arr_ == 3.5
    assert type(back.threshold_) is np.float32 and back.threshold_ == np.float32(0.25)
    assert type(back.count_) is np.int64 and back.count_ == 7
    np.testing.assert_array_equal(back.complex_, est.complex_)
    for name in ("labels_", "no_labels_", "mixed_"):
        got, want = getattr(back, name), getattr(est, name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert back.by_key_ == {1: "x"}
    assert back.tagged_ == {"__mlpapers_tuple__": [1, 2]}


@pytest.mark.parametrize("make", [lambda: np.random.RandomState(3),
                                  lambda: np.random.default_rng(3),
                                  lambda: np.random.Generator(np.random.MT19937(3))])
def test_save_load_with_a_numpy_generator_as_random_state(tmp_path, make):
    """``random_state=np.random.RandomState(...)`` made ``save`` raise TypeError."""
    X, y = _data()
    est = ToyRidge(jitter=0.2, random_state=make()).fit(X, y)
    est.save(tmp_path / "g.pt")
    back = ToyRidge.load(tmp_path / "g.pt")
    assert type(back.random_state) is type(est.random_state)
    draw = (lambda g: g.random_sample(4)) if isinstance(est.random_state,
                                                          np.random.RandomState) else (
        lambda g: g.random(4))
    np.testing.assert_array_equal(draw(back.random_state), draw(est.random_state))
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


class _AnyDim(TorchEstimatorMixin, BaseEstimator):
    """Accepts 1-D and 2-D input, like a transformer of single signals."""

    def fit(self, X, y=None):
        self._validate_data(X, reset=True, ndim=(1, 2))
        self.fitted_ = True
        return self

    def transform(self, X):
        return self._to_numpy(self._validate_data(X, reset=False, ndim=(1, 2)))


def test_tensor_and_array_paths_record_the_same_feature_count():
    """A 1-D tensor recorded ``n_features_in_ = 1`` where a 1-D array records none
    (fit on a tensor, transform an array: raised), and with ``ndim=(1, 2)`` the
    array path never recorded nor checked the feature count of 2-D input."""
    x = np.arange(5.0)
    for fit_on, apply_to in [(torch.from_numpy(x), x), (x, torch.from_numpy(x))]:
        est = _AnyDim().fit(fit_on)
        assert not hasattr(est, "n_features_in_")
        np.testing.assert_array_equal(est.transform(apply_to), x.astype(np.float32))
    for fit_on in (torch.ones(4, 3), np.ones((4, 3))):
        est = _AnyDim().fit(fit_on)
        assert est.n_features_in_ == 3
        for bad in (np.ones((2, 2)), torch.ones(2, 2)):
            with pytest.raises(ValueError, match="expecting 3 features"):
                est.transform(bad)


def test_big_endian_arrays_are_accepted_and_saved(tmp_path):
    """Arrays in non-native byte order (from FITS/HDF5/MATLAB files) raised in
    ``fit`` (torch cannot read them) and in ``save``."""
    X, y = _data()
    ref = ToyRidge().fit(X, y)
    swapped = X.dtype.newbyteorder(">" if np.little_endian else "<")
    Xb, yb = X.astype(swapped), y.astype(swapped)
    np.testing.assert_allclose(ToyRidge().fit(Xb, yb).coef_, ref.coef_)
    np.testing.assert_allclose(ToyRidge().fit(torch.from_numpy(X), yb).coef_, ref.coef_)
    np.testing.assert_allclose(ref.predict(Xb), ref.predict(X))
    ref.swapped_ = Xb
    ref.save(tmp_path / "b.pt")
    np.testing.assert_array_equal(ToyRidge.load(tmp_path / "b.pt").swapped_, X)


@pytest.mark.parametrize("name", ["mlpapers._base:os.system", "mlpapers._base:save",
                                  "mlpapers.__main__:main",
                                  "mlpapers.datasets._digits:make_shifted_digits",
                                  "mlpapers._base:TorchEstimatorMixin.__init__.__globals__"])
def test_load_never_calls_anything_but_an_estimator_class(tmp_path, name):
    """A crafted file named ``mlpapers._base:os.system``: ``load`` reached ``os.system``
    through the module's ``os`` attribute and called it with the file's params,
    running a shell command despite ``weights_only=True``."""
    marker = tmp_path / "called"
    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "class": name, "params": {"command": f"touch {marker}"},
                "state": {}, "rng": {}}, path)
    for loader in (load, ToyRidge.load):
        with pytest.raises(ValueError, match="refusing to load"):
            loader(path)
    assert not marker.exists()


def test_save_load_dtype_objects(tmp_path):
    """``dtype=torch.float64`` (a common parameter) and numpy dtypes made ``save`` raise."""
    X, y = _data()
    est = ToyRidge().fit(X, y)
    est.dtypes_ = [torch.float64, torch.bfloat16, np.dtype(">f4"), np.float32, np.int64,
                   float, bool]
    est.save(tmp_path / "d.pt")
    assert ToyRidge.load(tmp_path / "d.pt").dtypes_ == est.dtypes_


class _RidgeWithMembers(ToyRidge):
    @property
    def norm_(self):
        return float(np.linalg.norm(self.coef_))

    def shifted_(self, c):
        return self.coef_ + c


@pytest.mark.parametrize("key", ["predict", "_device", "__class__", "fit_intercept", 3,
                                 "norm_", "shifted_"])
def test_load_state_sets_only_fitted_attributes(tmp_path, key):
    """A crafted file's state could replace a method (``predict = str``) or a private
    attribute (``_device``): only fitted ``name_`` attributes (and a class's declared
    private state) are set; names ending in ``_`` that the class defines as a property
    or method (``norm_``, ``shifted_``) are not fitted attributes either."""
    X, y = _data()
    path = tmp_path / "m.pt"
    _RidgeWithMembers().fit(X, y).save(path)
    payload = torch.load(path, weights_only=True)
    payload["state"][key] = "x"
    torch.save(payload, path)
    with pytest.raises(ValueError, match="not a fitted attribute"):
        _RidgeWithMembers.load(path)


@pytest.mark.parametrize("edit", ["bad tag", "unknown param", "state not a dict"])
def test_load_reports_a_malformed_file_as_value_error(tmp_path, edit):
    """A bad tag raised ``KeyError`` from the decoder, an unknown parameter a
    ``TypeError`` from the constructor."""
    X, y = _data()
    path = tmp_path / "m.pt"
    ToyRidge().fit(X, y).save(path)
    payload = torch.load(path, weights_only=True)
    if edit == "bad tag":
        payload["state"]["coef_"] = {"__mlpapers_dtype__": "nope", "kind": "builtin type"}
    elif edit == "unknown param":
        payload["params"]["bogus"] = 1
    else:
        payload["state"] = [1, 2]
    torch.save(payload, path)
    with pytest.raises(ValueError, match="not a valid mlpapers estimator file"):
        ToyRidge.load(path)


def test_save_of_an_estimator_without_fit_says_why(tmp_path):
    """Samplers (no ``fit``) got scikit-learn's misleading "is not an estimator
    instance" from ``check_is_fitted``."""

    class Sampler(TorchEstimatorMixin, BaseEstimator):
        def sample(self):
            return 1

    with pytest.raises(TypeError, match="has no fit method"):
        Sampler().save(tmp_path / "s.pt")


class _SumFeatures(TorchEstimatorMixin, BaseEstimator):
    """Accepts 1-D (one value per sample) or 2-D input."""

    def fit(self, X):
        self._init_fit()
        self._validate_data(X, reset=True, ndim=(1, 2))
        self.fitted_ = True
        return self

    def transform(self, X):
        return self._to_numpy(self._validate_data(X, reset=False, ndim=(1, 2)))


@pytest.mark.parametrize("as_tensor", [False, True])
def test_refit_on_1d_input_drops_the_feature_count_of_an_earlier_fit(as_tensor):
    """A refit on 1-D input kept ``n_features_in_`` of an earlier 2-D fit, so 1-D input
    was then refused ("expecting 5 features")."""
    conv = torch.as_tensor if as_tensor else np.asarray
    est = _SumFeatures().fit(conv(np.ones((10, 5))))
    assert est.n_features_in_ == 5
    est.fit(conv(np.arange(10.0)))
    assert not hasattr(est, "n_features_in_")
    np.testing.assert_array_equal(est.transform(conv(np.arange(3.0))), np.arange(3.0))


def test_restore_on_failure_puts_the_estimator_back_as_it_was():
    import inspect

    from mlpapers._base import restore_on_failure

    class Est:
        @restore_on_failure
        def fit(self, X, fail_after=None):
            """Doc kept."""
            self.coef_ = X
            self.n_features_in_ = len(X)
            self.extra_ = "new"
            if fail_after is not None:
                raise fail_after
            return self

    est = Est()
    with pytest.raises(ValueError):  # unfitted stays unfitted
        est.fit([1, 2], fail_after=ValueError("late"))
    assert vars(est) == {}
    fitted = est.fit([1, 2, 3])
    assert fitted is est and est.coef_ == [1, 2, 3]
    before = dict(vars(est))
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C too
        est.fit([9], fail_after=KeyboardInterrupt())
    assert vars(est) == before and est.coef_ is before["coef_"]
    assert Est.fit.__doc__ == "Doc kept."
    assert list(inspect.signature(Est.fit).parameters) == ["self", "X", "fail_after"]


def test_tensor_x_with_missing_or_short_y_is_refused_like_arrays():
    """The tensor path checks ``y`` itself (arrays go through scikit-learn)."""
    X, y = _data()
    for bad_y, match in [(None, "requires y to be passed"),
                         (y[:-1], "inconsistent numbers of samples")]:
        for X_in in (X, torch.from_numpy(X)):
            with pytest.raises(ValueError, match=match):
                ToyRidge().fit(X_in, bad_y)


class _Stacks(TorchEstimatorMixin, BaseEstimator):
    """Accepts 2-D and 3-D input (rows of features, or of small matrices)."""

    def fit(self, X, y=None):
        self._validate_data(X, reset=True, ndim=(2, 3))
        self.fitted_ = True
        return self


def test_input_with_more_dimensions_than_allowed_names_them():
    """scikit-learn's ``allow_nd`` accepts any number of dimensions above 2: the base
    refuses those outside ``ndim`` itself, for arrays as for tensors."""
    for X in (np.ones((2, 3, 4)), torch.ones(2, 3, 4)):
        assert _Stacks().fit(X).fitted_
    for X in (np.ones((2, 3, 4, 5)), torch.ones(2, 3, 4, 5)):
        with pytest.raises(ValueError, match=r"2D or 3D.*got 4D|4D.*2D or 3D"):
            _Stacks().fit(X)


def test_save_of_a_foreign_object_and_load_of_a_missing_class(tmp_path):
    from sklearn.linear_model import Ridge

    with pytest.raises(TypeError, match="save expects an mlpapers estimator, got Ridge"):
        save(Ridge(), tmp_path / "r.pt")
    X, y = _data()
    path = tmp_path / "toy.pt"
    save(ToyRidge().fit(X, y), path)
    payload = torch.load(path, weights_only=True)
    for name in ("mlpapers.no_such_module:ToyRidge", "mlpapers._base:NoSuchClass"):
        payload["class"] = name
        torch.save(payload, path)
        with pytest.raises(ValueError, match="cannot load"):
            load(path)


def test_device_and_numpy_string_parameters_survive_save_load(tmp_path):
    """Parameters may hold a ``torch.device`` or a numpy string scalar (read from an
    array of settings): ``save`` stores them as plain values that mean the same."""
    X, y = _data()
    est = ToyRidge(device=torch.device("cpu"), alpha=1.0).fit(X, y)
    est.note_ = np.str_("ridge")
    est.save(tmp_path / "toy.pt")
    back = ToyRidge.load(tmp_path / "toy.pt")
    assert torch.device(back.device) == torch.device("cpu")
    assert back.note_ == "ridge"
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


def test_valid_data_near_the_float32_maximum_raises_no_numpy_warning():
    """scikit-learn's finiteness check sums the data first: finite float32 values near
    the maximum overflowed that sum and numpy warned "invalid value encountered in
    reduce" about valid data (session 23)."""
    import warnings

    from mlpapers.retrieval import ExactMIPS

    # (numpy's pairwise sum of these overflows to +inf and -inf, whose sum is NaN)
    K = np.array([[3e38, 3e38], [3e38, 3e38], [-3e38, -3e38], [-3e38, -3e38]] * 4,
                 dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(K.sum())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        est = ExactMIPS().fit(K)
        est.kneighbors(np.array([[1.0, -1.0]], dtype=np.float32), 1)
    with pytest.raises(ValueError, match="infinity"):
        ExactMIPS().fit(np.array([[np.inf, 1.0]], dtype=np.float32))
