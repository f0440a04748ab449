"""Every public method refuses a bad switch, number or option by name.

The calls are taken from the class docstring examples: each example runs with the
class's public methods wrapped to record their first call. Each call is then repeated
with one parameter (whose default, or whose value in the example, is a switch, a number
or a string) replaced by a value no parameter of its kind accepts: ``"no"`` for a
switch, NaN for a number, an unknown option for a string. It must raise ``ValueError``
or ``TypeError`` naming the parameter. Classes and methods are discovered, so a new one
is checked without editing this file. The fitting methods are checked by
``test_estimator_params.py`` (through the constructor parameters they read).
"""

import doctest
import functools
import inspect
import os
import tempfile

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator

from tests._public import bad_value_like, names_param, public_classes

NOT_REPLAYED = {"fit", "partial_fit", "fit_predict", "fit_transform", "sample", "save",
                "load", "get_params", "set_params", "get_metadata_routing", "set_output"}
#: ``Class.method.parameter`` left to torch's rule for a flag, with the reason
TORCH_RULE = {f"{cls}.score_and_key.create_graph": "called at every training step, as "
              "torch.autograd.grad(create_graph=...) it reads a truth value"
              for cls in ("Homogenize", "KeyNet", "SupportFunction", "SupportNet")}


def _record_example_calls(cls):
    """``{method: (instance, args, kwargs)}`` of the first call of each public method of
    ``cls`` in its docstring example."""
    calls: dict = {}
    originals = {}
    for name, method in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_") or name in NOT_REPLAYED:
            continue
        if not (method.__module__ or "").startswith("mlpapers"):
            continue
        originals[name] = cls.__dict__.get(name)

        def recording(name=name, method=method):
            @functools.wraps(method)
            def wrapper(self, *args, **kwargs):
                if name not in calls and type(self) is cls:
                    calls[name] = (self, args, kwargs)
                return method(self, *args, **kwargs)
            return wrapper
        setattr(cls, name, recording())
    namespace: dict = {}
    cwd = os.getcwd()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.chdir(tmp)
            for example in doctest.DocTestParser().get_examples(cls.__doc__ or ""):
                exec(compile(example.source, f"<{cls.__name__} example>", "exec"), namespace)
    finally:
        os.chdir(cwd)
        for name, original in originals.items():
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
    return calls


RECORDED = {cls: _record_example_calls(cls) for cls in public_classes()}


def _cases():
    cases = []
    for cls, calls in RECORDED.items():
        for method, (obj, args, kwargs) in calls.items():
            sig = inspect.signature(getattr(cls, method))
            bound = sig.bind(obj, *args, **kwargs)
            for name, par in sig.parameters.items():
                if name == "self" or par.kind in (par.VAR_POSITIONAL, par.VAR_KEYWORD):
                    continue
                key = f"{cls.__name__}.{method}.{name}"
                value = bound.arguments.get(name, par.default)
                bad = bad_value_like(value)
                if bad is not None and key not in TORCH_RULE:
                    cases.append(pytest.param(cls, method, bound.arguments, name, bad, id=key))
    return cases


CASES = _cases()


def test_most_method_parameters_are_checked():
    # (the examples call most methods with arrays only: 17 parameters of 16 methods)
    assert len(CASES) >= 15, [case.id for case in CASES]


def test_user_subclasses_defined_by_exec_are_accepted():
    """A class body run by ``exec`` with a bare namespace (as the examples here are) gives
    its functions ``__module__ = None``: the library's method wrapping failed on it."""
    namespace: dict = {}
    exec("from mlpapers.sampling import ConvexContainer\n"
         "class Half(ConvexContainer):\n"
         "    dim = 1\n"
         "    def contains(self, x, tol=0.0):\n"
         "        return x[:, 0] >= -tol\n", namespace)
    half = namespace["Half"]()
    assert half.contains(np.array([[1.0], [-1.0]])).tolist() == [True, False]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("cls", "method", "arguments", "name", "bad"), CASES)
def test_a_bad_method_parameter_is_refused_by_name(cls, method, arguments, name, bad):
    call = dict(arguments)
    call[name] = bad
    with pytest.raises((ValueError, TypeError)) as err:
        getattr(cls, method)(**call)
    assert names_param(name, str(err.value)), (
        f"{cls.__name__}.{method}({name}={bad!r}): {err.value!r}")


def _same(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        a, b = a.detach().cpu().numpy(), b.detach().cpu().numpy()
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    return bool(a == b)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("cls", [cls for cls, calls in RECORDED.items()
                                 if issubclass(cls, BaseEstimator) and calls])
def test_a_bad_parameter_set_after_fit_is_unread_or_refused(cls):
    """After the example's fit, each constructor parameter set to a bad value (as
    ``set_params`` would) either leaves the example's inference calls' outputs as they
    were (the parameter is not read there) or is refused by name: SCENT's temperature
    gave NaN probabilities, KL-DRO's objective read lam and alpha, ADACUR its ridge."""
    for method, (obj, args, kwargs) in RECORDED[cls].items():
        reference = getattr(obj, method)(*args, **kwargs)
        for name, par in inspect.signature(cls.__init__).parameters.items():
            bad = bad_value_like(getattr(obj, name, par.default))
            if name in ("self", "device", "verbose") or bad is None:
                continue
            saved = obj.__dict__[name]
            obj.__dict__[name] = bad
            try:
                out = getattr(obj, method)(*args, **kwargs)
            except (ValueError, TypeError) as exc:
                assert names_param(name, str(exc)), f"{method} after {name}={bad!r}: {exc!r}"
            else:
                assert _same(out, reference), f"{method} read {name}={bad!r} unchecked"
            finally:
                obj.__dict__[name] = saved
