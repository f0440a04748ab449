"""Every estimator checks, in ``fit``, each constructor parameter whose default is a
switch, a number or a string, also the ones its current settings do not read (as
scikit-learn checks ``SVC(kernel="linear", gamma=-1)``).

The fit of each public estimator is taken from its class docstring example: the example
runs with one parameter replaced, just before the estimator's first ``fit`` (or
``sample``) call, by a value no parameter of its kind accepts: ``"no"`` for a switch
(default ``True``/``False``), NaN for a number and an unknown option for a string. The
call must raise ``ValueError`` or ``TypeError`` naming the parameter. The examples run
the default method, so the parameters of the other methods are the ones left unread.
Estimators and parameters are discovered, so a new one is checked without editing this
file; ``device`` is left out (any device string names a device torch may know).
"""

import doctest
import functools
import inspect
import numbers
import os
import tempfile

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator

from tests._public import bad_value_like, names_param, public_classes

FIT_METHODS = ("fit", "sample", "partial_fit", "fit_predict", "fit_transform")
NOT_CHECKED = ("self", "device")


def _estimators():
    return [cls for cls in public_classes() if issubclass(cls, BaseEstimator)]


def _cases():
    cases = []
    for cls in _estimators():
        for name, par in inspect.signature(cls.__init__).parameters.items():
            bad = bad_value_like(par.default)
            if name not in NOT_CHECKED and bad is not None:
                cases.append(pytest.param(cls, name, bad, id=f"{cls.__name__}.{name}"))
    return cases


def _run_example_with(cls, name, bad, convert=False):
    """Run ``cls``'s docstring example with ``name`` set to ``bad`` (or, with
    ``convert``, to ``bad(the example's value)``) before the first fit; return the
    error that fit raised (None if it raised nothing) and whether it ran."""
    examples = doctest.DocTestParser().get_examples(cls.__doc__ or "")
    originals = {m: cls.__dict__.get(m) for m in FIT_METHODS if hasattr(cls, m)}
    state: dict = {"set": False, "raised": None}

    def patched(method):
        bound = getattr(cls, method)

        @functools.wraps(bound)
        def wrapper(self, *args, **kwargs):
            if not state["set"] and type(self) is cls:
                state["set"] = True
                setattr(self, name, bad(getattr(self, name)) if convert else bad)
            try:
                return bound(self, *args, **kwargs)
            except (ValueError, TypeError) as exc:
                state["raised"] = exc  # raised by the fit, not by a later line
                raise
        return wrapper

    patched_methods = []
    namespace: dict = {}
    cwd = os.getcwd()
    try:
        for method in originals:
            setattr(cls, method, patched(method))
            patched_methods.append(method)
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)  # examples that save a file write it here
            for example in examples:
                try:
                    exec(compile(example.source, f"<{cls.__name__} example>", "exec"),
                         namespace)
                except (ValueError, TypeError) as exc:
                    if state["set"] and exc is state["raised"]:
                        return exc, True
                    raise
    finally:
        os.chdir(cwd)
        for method in patched_methods:
            if originals[method] is None:  # inherited: the subclass had none of its own
                delattr(cls, method)
            else:
                setattr(cls, method, originals[method])
    return None, state["set"]


def _numpy_cases():
    """Integer and switch parameters, to be given as numpy scalars (``np.arange`` or
    ``np.array([True, False])`` in a parameter grid makes them)."""
    cases = []
    for cls in _estimators():
        for name, par in inspect.signature(cls.__init__).parameters.items():
            default = par.default
            if name not in NOT_CHECKED and isinstance(default, numbers.Integral):
                cases.append(pytest.param(cls, name, id=f"{cls.__name__}.{name}"))
    return cases


def test_every_estimator_has_a_fitting_example():
    for cls in _estimators():
        assert doctest.DocTestParser().get_examples(cls.__doc__ or ""), cls.__name__


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("cls", "name", "bad"), _cases())
def test_fit_refuses_a_bad_scalar_parameter_by_name(cls, name, bad):
    error, ran = _run_example_with(cls, name, bad)
    assert ran, f"{cls.__name__}'s example never fits it"
    assert error is not None, f"{cls.__name__}({name}={bad!r}) fitted without an error"
    assert names_param(name, str(error)), (
        f"{cls.__name__}({name}={bad!r}) raised an error that does not name {name}: "
        f"{error!r}")


def _methods_with_switches():
    found = set()
    for cls in public_classes():
        for name, method in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") or not method.__module__.startswith("mlpapers"):
                continue
            for param, p in inspect.signature(method).parameters.items():
                if isinstance(p.default, bool):
                    found.add(f"{cls.__name__}.{name}.{param}")
    return found


#: per-step methods of the torch modules, called in every training step, that follow
#: torch's rule for a flag (``torch.autograd.grad(create_graph=...)`` reads a truth value)
PER_STEP = {f"{cls}.score_and_key.create_graph"
            for cls in ("Homogenize", "KeyNet", "SupportFunction", "SupportNet")}


def _switch_calls():
    """``{"Class.method.switch": call(bad value)}`` on small fitted estimators."""
    from mlpapers.anomaly import PatchCoreDetector, RADDetector
    from mlpapers.datasets import make_texture_anomalies
    from mlpapers.retrieval import (
        AdaCURRetriever,
        AmortizedMIPS,
        AnnCURRetriever,
        ExactMIPS,
        RelevanceBasedRetriever,
    )
    from mlpapers.sampling import Box, ReflectiveHMC

    rng = np.random.default_rng(0)
    keys, queries = rng.standard_normal((20, 3)), rng.standard_normal((4, 3))
    X_train, X_test, _, _ = make_texture_anomalies(3, 2, image_size=32, random_state=0)
    detectors = {cls: cls(extractor="random", image_size=None).fit(X_train)
                 for cls in (RADDetector, PatchCoreDetector)}
    exact = ExactMIPS().fit(keys)
    amips = AmortizedMIPS(n_steps=2, random_state=0).fit(keys)
    heavy = {cls: cls(lambda q, i: q @ i.T, random_state=0, **kw).fit(queries, keys)
             for cls, kw in ((RelevanceBasedRetriever, {"n_support": 3}),
                             (AnnCURRetriever, {"n_support": 3}),
                             (AdaCURRetriever, {"n_calls": 4, "n_rounds": 2}))}
    hmc = ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box([0.0], [1.0]), n_leapfrog=2,
                        step_size=0.1, random_state=0)
    calls = {f"{cls.__name__}.anomaly_map.return_scores":
             (lambda bad, det=det: det.anomaly_map(X_test, return_scores=bad))
             for cls, det in detectors.items()}
    for name, est in [("ExactMIPS", exact), ("AmortizedMIPS", amips)] + [
            (cls.__name__, est) for cls, est in heavy.items()]:
        calls[f"{name}.kneighbors.return_distance"] = (
            lambda bad, est=est: est.kneighbors(queries, 2, return_distance=bad))
    calls["AdaCURRetriever.predict.return_anchors"] = (
        lambda bad: heavy[AdaCURRetriever].predict(queries, return_anchors=bad))
    calls["ReflectiveHMC.sample.return_tensor"] = (
        lambda bad: hmc.sample(2, warmup=0, return_tensor=bad))
    assert torch.is_tensor(hmc.sample(2, warmup=0, return_tensor=True).samples_tensor)
    return calls


@pytest.mark.filterwarnings("ignore")  # (tiny fits warn about their size)
def test_method_switches_take_only_true_or_false():
    calls = _switch_calls()
    assert set(calls) == _methods_with_switches() - PER_STEP  # a new switch is listed
    for key, call in calls.items():
        switch = key.rsplit(".", 1)[1]
        for bad in ("no", None):
            with pytest.raises(TypeError, match=f"{switch} must be a bool"):
                call(bad)


def _as_numpy_scalar(value):
    if isinstance(value, bool):
        return np.bool_(value)
    # (an example may set another kind of value, e.g. image_size=None: left as it is)
    return np.int64(value) if isinstance(value, numbers.Integral) else value


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("cls", "name"), _numpy_cases())
def test_numpy_scalars_are_taken_as_python_scalars(cls, name, monkeypatch):
    """The example's own value of an integer or switch parameter, as a numpy scalar,
    fits without an error (``ReflectiveHMC(jitter=np.True_)`` was refused)."""
    error, ran = _run_example_with(cls, name, _as_numpy_scalar, convert=True)
    assert ran and error is None, error


def test_a_numpy_true_jitter_is_the_default_jitter():
    from mlpapers.sampling import Box, ReflectiveHMC

    def draws(jitter):
        hmc = ReflectiveHMC(lambda x: -0.5 * (x ** 2).sum(-1), Box([0.0], [1.0]),
                            n_leapfrog=3, step_size=0.3, jitter=jitter, random_state=0)
        return hmc.sample(20, warmup=0).samples

    np.testing.assert_array_equal(draws(np.True_), draws(True))
    assert not np.array_equal(draws(True), draws(0.9))  # the jitter changes the draws


def test_int_switches_of_older_pickles_unpickle_as_bools():
    """Before the switches were checked, 0 or 1 worked as a truth value: an estimator
    pickled with one unpickles with the bool it meant (files: see the AMIPS tests)."""
    import pickle

    checked = 0
    for cls in _estimators():
        for name, par in inspect.signature(cls.__init__).parameters.items():
            if not isinstance(par.default, bool):
                continue
            est = cls()
            state = est.__getstate__()
            state[name] = int(not par.default)
            old = pickle.loads(pickle.dumps(est))
            old.__setstate__(state)
            assert getattr(old, name) is (not par.default), (cls.__name__, name)
            checked += 1
    assert checked >= 12


def test_pickles_made_before_a_parameter_existed_get_its_default():
    """A pickle from a version without a constructor parameter (RAD's ``map_size``,
    AMIPS's ``center_keys``) lacks it: unpickled, it takes the default, which is that
    version's behaviour, and get_params works (it raised AttributeError)."""
    checked = 0
    for cls in _estimators():
        params = inspect.signature(cls.__init__).parameters
        defaults = {n: p.default for n, p in params.items()
                    if n != "self" and p.default is not p.empty}
        required = {n: None for n, p in params.items()
                    if n != "self" and p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        for name, default in defaults.items():
            state = {**required, **defaults}
            del state[name]
            old = cls.__new__(cls)
            old.__setstate__(state)
            assert getattr(old, name) is default, (cls.__name__, name)
            assert name in old.get_params()
            checked += 1
    assert checked >= 150
