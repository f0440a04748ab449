"""The typed user code of ``tests/typecheck``: mypy checks its ``assert_type`` calls
statically (CI); here it runs with ``assert_type`` replaced by a runtime check, so each
asserted type also holds for the value the call returns. And the lazy exports are visible
to type checkers."""

import ast
import collections.abc
import dataclasses
import importlib
import inspect
import types
import typing
from pathlib import Path

import numpy as np
import pytest

import mlpapers
import mlpapers.datasets
from tests._public import package_modules, public_classes

CHECKS = sorted(p.stem for p in (Path(__file__).parent / "typecheck").glob("check_*.py"))

# PEP 484's numeric tower: a checker accepts an int where a float is declared
_PROMOTIONS = {float: (float, int), complex: (complex, float, int)}


def _conforms(value, tp) -> bool:
    """Whether ``value`` is of the static type ``tp`` (the forms the checks use)."""
    if tp is typing.Any:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is typing.Literal:  # (by type too: True == 1, but Literal[1] refuses True)
        return any(value == a and type(value) is type(a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(_conforms, value, args))
    if origin in (list, collections.abc.Sequence, collections.abc.Iterable):
        return (isinstance(value, origin) and not (isinstance(value, str) and args[0] is not str)
                and all(_conforms(v, args[0]) for v in value))
    if origin is type:  # type[X], type[X | Y], type[np.floating[Any]]
        classes = typing.get_args(args[0]) if typing.get_origin(args[0]) in (
            typing.Union, types.UnionType) else (args[0],)
        return isinstance(value, type) and any(
            issubclass(value, typing.get_origin(c) or c) for c in classes)
    if origin is not None:  # another generic (Callable, dict, np.dtype...): its class only
        return isinstance(value, origin)
    try:
        return isinstance(value, _PROMOTIONS.get(tp, tp)) and not (
            tp in (int, float) and isinstance(value, bool))
    except TypeError:  # a protocol that cannot be checked at runtime (numpy's array-likes)
        return True


def _assert_type_at_runtime(value, tp):
    assert _conforms(value, tp), f"expected {tp}, got {type(value).__name__}: {value!r:.200}"
    return value


@pytest.mark.parametrize("value, tp, ok", [
    (1.0, float, True), (1, float, True), (True, float, False), ("a", float, False),
    ((1, 2.0), tuple[int, float], True), ((1, 2.0), tuple[float], False),
    ((1.0, 2.0), tuple[float, ...], True), ([1, "a"], list[int], False),
    (None, int | None, True), ([[1]], list[list[int]], True), (2, typing.Literal[1, 2], True),
    (True, typing.Literal[1], False), (("a",), collections.abc.Sequence[float], False),
    ((1, 2), collections.abc.Sequence[int], True), (int, type[float], False),
    (float, type[float], True), (np.float32, type[np.floating[typing.Any]], True),
    (np.int64, type[np.floating[typing.Any]] | type[float], False),
])
def test_runtime_type_check(value, tp, ok):
    assert _conforms(value, tp) is ok


@pytest.mark.parametrize("name", CHECKS)
def test_typed_user_code_runs_with_its_types(name, monkeypatch):
    module = importlib.import_module(f"tests.typecheck.{name}")
    assert module.assert_type is typing.assert_type  # what the check below replaces
    monkeypatch.setattr(module, "assert_type", _assert_type_at_runtime)
    module.check()


def _type_checking_imports(module) -> dict[str, str]:
    """``{name: module it is imported from}`` under the module's ``if TYPE_CHECKING:``."""
    names = {}
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                names.update({alias.name: stmt.module for alias in stmt.names})
    return names


@pytest.mark.parametrize("module, lazy", [
    (mlpapers, set(mlpapers._SUBMODULES)),
    (mlpapers.datasets, set(mlpapers.datasets._LAZY)),
])
def test_lazy_exports_are_declared_to_type_checkers(module, lazy):
    # a name served by the module's __getattr__ is Any to mypy and pyright unless the
    # module also imports it under TYPE_CHECKING, from where the lazy import finds it
    declared = _type_checking_imports(module)
    assert set(declared) == lazy
    for name, source in declared.items():
        assert getattr(importlib.import_module(source), name) is getattr(module, name)


def _own_init(cls):
    """The ``__init__`` a class gets from mlpapers (its own or a base's), else None."""
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return vars(klass)["__init__"] if klass.__module__.startswith("mlpapers.") else None
    return None


PUBLIC_CLASSES = [c for c in public_classes() if _own_init(c) is not None]


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda c: c.__qualname__)
def test_constructor_parameters_are_annotated_and_defaults_conform(cls):
    # unannotated, pyright and Pylance infer a parameter's type from its default
    # (architecture="resnet" would refuse a list of widths): every constructor parameter
    # carries its documented type, and its default is a value of that type
    init = _own_init(cls)
    hints = typing.get_type_hints(init)
    factories = {f.name: f.default_factory for f in dataclasses.fields(cls)
                 if f.default_factory is not dataclasses.MISSING} \
        if dataclasses.is_dataclass(cls) else {}
    for name, param in inspect.signature(init).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        assert name in hints, f"{cls.__qualname__}({name}=...) has no annotation"
        default = factories[name]() if name in factories else param.default
        if default is not param.empty:
            assert _conforms(default, hints[name]), (
                f"{cls.__qualname__}: the default {name}={default!r} is not a {hints[name]}")


def _literal_values(tp) -> set:
    """The values of every ``Literal`` inside the type ``tp`` (through unions)."""
    if typing.get_origin(tp) is typing.Literal:
        return set(typing.get_args(tp))
    return set().union(*(_literal_values(a) for a in typing.get_args(tp)))


def _option_lists():
    from mlpapers.decentralized import BottleneckNodeAssigner
    from mlpapers.decentralized.btsp import _assign
    from mlpapers.federated import IFCA, CLoVE, FedAvg
    from mlpapers.federated.clove import _models
    from mlpapers.optim import (
        KLDROClassifier,
        KLDRORegressor,
        PartialAUCClassifier,
        SCENTClassifier,
    )
    from mlpapers.optim.scent import _loss, _xc
    from mlpapers.retrieval import AdaCURRetriever, AmortizedMIPS, RelevanceBasedRetriever
    from mlpapers.retrieval.amips import _config
    from mlpapers.retrieval.amips import _kernels as _amips_kernels
    from mlpapers.retrieval.rbe import _selection, _validation
    from mlpapers.ssl import CLAPPEncoder
    from mlpapers.ssl.clapp import _estimator, _kernels

    out = [(BottleneckNodeAssigner, "method", _assign.METHODS),
           (SCENTClassifier, "loss", _xc.LOSSES),
           (SCENTClassifier, "negatives", _xc.NEGATIVES),
           (CLAPPEncoder, "variant", _estimator.VARIANTS),
           (CLAPPEncoder, "loss", _kernels.LOSSES)]
    out += [(cls, "method", _loss.METHODS) for cls in (
        SCENTClassifier, KLDROClassifier, KLDRORegressor, PartialAUCClassifier)]
    for cls in (CLoVE, IFCA, FedAvg):
        out += [(cls, "model", _models.BUILTIN_MODELS), (cls, "loss", ("auto", *_models.LOSSES))]
    out += [(AmortizedMIPS, "arch", _config.ARCHS),
            (AmortizedMIPS, "retrieval", _amips_kernels.METRICS),
            (AdaCURRetriever, "init", _selection.SUPPORT_METHODS),
            (RelevanceBasedRetriever, "support", _selection.SUPPORT_METHODS),
            (RelevanceBasedRetriever, "head", _validation.HEADS),
            (RelevanceBasedRetriever, "loss", _validation.LOSSES)]
    return out


@pytest.mark.parametrize("cls, name, options", _option_lists(),
                         ids=lambda v: v.__qualname__ if isinstance(v, type) else None)
def test_literal_annotations_list_the_options_the_code_checks(cls, name, options):
    # the Literal of a parameter repeats the tuple its validation checks against: they
    # must not drift apart (a value missing from the Literal is refused by users' checkers)
    hints = typing.get_type_hints(_own_init(cls))
    assert _literal_values(hints[name]) == set(options)


def _function_option_lists():
    """``(function, parameter, options[, test id])``: the id names the class a method is
    reached from where it is inherited (its ``__qualname__`` names the base)."""
    from mlpapers.anomaly import PatchCoreDetector, RADDetector
    from mlpapers.anomaly.rad import _common
    from mlpapers.datasets import (
        _federated,
        _textures,
        make_federated_digits,
        make_texture_anomalies,
    )
    from mlpapers.decentralized import BottleneckNodeAssigner
    from mlpapers.decentralized.btsp import (
        _bottleneck,
        _data,
        bottleneck_delay,
        bottleneck_tsp,
        make_delay_matrix,
    )
    from mlpapers.retrieval.amips import _kernels as _amips_kernels
    from mlpapers.retrieval.amips import build_faiss_ivf, rank_by_key
    from mlpapers.retrieval.rbe import _selection, greedy_selection, select_support
    from mlpapers.sampling import SampleResult, StiefelResult, ess
    from mlpapers.sampling.rehmc import _diagnostics
    from mlpapers.ssl.clapp import _kernels, _similarity, exact_linear_feedback, update_similarity

    return [
        (rank_by_key, "metric", _amips_kernels.METRICS),
        (build_faiss_ivf, "metric", _amips_kernels.METRICS),
        (greedy_selection, "method", _selection.GREEDY_METHODS),
        (select_support, "method", _selection.SUPPORT_METHODS),
        (select_support, "greedy_method", _selection.SELECT_GREEDY_METHODS),
        (ess, "kind", _diagnostics.ESS_KINDS),
        (SampleResult.ess, "kind", _diagnostics.ESS_KINDS),
        (StiefelResult.ess, "kind", _diagnostics.ESS_KINDS, "StiefelResult.ess"),
        (RADDetector.predict_proba, "method", _common.PROBA_METHODS,
         "RADDetector.predict_proba"),
        (PatchCoreDetector.predict_proba, "method", _common.PROBA_METHODS,
         "PatchCoreDetector.predict_proba"),
        (exact_linear_feedback, "mode", _kernels.FEEDBACK_MODES),
        (update_similarity, "reference", _similarity.REFERENCES),
        (BottleneckNodeAssigner.bcd, "reduce", _bottleneck.REDUCES),
        (bottleneck_delay, "reduce", _bottleneck.REDUCES),
        (bottleneck_tsp, "method", _bottleneck.TSP_METHODS),
        (make_delay_matrix, "kind", _data.KINDS),
        (make_federated_digits, "kind", _federated.FEDERATED_KINDS),
        (make_texture_anomalies, "textures",
         _textures.TEXTURES + _textures.SKIMAGE_TEXTURES),
        (make_texture_anomalies, "defects", _textures.DEFECTS),
        (make_texture_anomalies, "source", _textures.SOURCES),
    ]


def _type_hints(func) -> dict:
    """``typing.get_type_hints(func)``, with the names its module imports only under
    ``TYPE_CHECKING`` (e.g. ``update_similarity``'s ``CLAPPEncoder``) resolved too."""
    module = inspect.getmodule(inspect.unwrap(func))
    names: dict = {}
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            exec(compile(ast.Module(node.body, []), module.__file__, "exec"), names)
    return typing.get_type_hints(func, localns=names)


@pytest.mark.parametrize("func, name, options", [
    pytest.param(f, n, o, id=f"{label[0] if label else f.__qualname__}-{n}")
    for f, n, o, *label in _function_option_lists()])
def test_literal_annotations_of_functions_list_the_options_the_code_checks(func, name, options):
    # as for the constructors above, for the public functions and methods
    hints = _type_hints(func)
    assert _literal_values(hints[name]) == set(options)


_SCENT_CLASSES = ("optim.SCENTClassifier", "optim.KLDRORegressor", "optim.KLDROClassifier",
                  "optim.PartialAUCClassifier")
# validators (``check_*`` functions) check an attribute of the estimator they get, and a
# base class may check an option only some subclasses offer: (module, parameter) -> the
# public classes whose parameter that check is about
_OPTION_CHECK_OWNERS = {
    ("mlpapers.optim.scent._common", "method"): _SCENT_CLASSES,
    ("mlpapers.optim.scent._common", "lr_schedule"): _SCENT_CLASSES,
    ("mlpapers.retrieval.amips._config", "arch"): ("retrieval.AmortizedMIPS",),
    ("mlpapers.retrieval.amips._config", "retrieval"): ("retrieval.AmortizedMIPS",),
    ("mlpapers.retrieval.rbe._validation", "loss"): ("retrieval.RelevanceBasedRetriever",),
    ("mlpapers.retrieval.rbe._validation", "head"): ("retrieval.RelevanceBasedRetriever",),
    ("mlpapers.retrieval.rbe._validation", "support"): ("retrieval.RelevanceBasedRetriever",),
    ("mlpapers.retrieval.rbe._validation", "init"): ("retrieval.AdaCURRetriever",),
    ("mlpapers.federated.clove._engine", "optimizer"): (
        "federated.CLoVE", "federated.IFCA", "federated.FedAvg"),
    ("mlpapers.federated.clove._federation", "n_clusters"): ("federated.CLoVE",),  # "auto"
}


def _public(path: str):
    module, name = path.split(".")
    return getattr(importlib.import_module(f"mlpapers.{module}"), name)


def _hints_of(owner) -> dict:
    """The annotations of a parameter owner: a class's constructor or a function."""
    if isinstance(owner, type):
        init = _own_init(owner)
        return typing.get_type_hints(init) if init is not None else {}
    return _type_hints(owner)


def _takes(owner, name: str) -> bool:
    target = _own_init(owner) if isinstance(owner, type) else owner
    return target is not None and name in inspect.signature(target).parameters


def _constructors_taking(cls: type, name: str) -> list[type]:
    """``cls`` and its subclasses (a base class checks for them) whose constructor takes
    the parameter ``name``."""
    todo, found = [cls], []
    while todo:
        klass = todo.pop()
        todo += klass.__subclasses__()
        if _takes(klass, name):
            found.append(klass)
    return found


def _option_checks():
    """Every ``check_in_options(<value>, "<param>", <options>)`` of mlpapers: (where,
    parameter, the evaluated options, the owners whose annotation must list them)."""
    found = []
    for module in package_modules(public_only=False):
        tree = ast.parse(inspect.getsource(module))
        for top in tree.body:
            classes = [top] if isinstance(top, ast.ClassDef) else []
            functions = [top] if isinstance(top, ast.FunctionDef) else [
                f for f in getattr(top, "body", []) if isinstance(f, ast.FunctionDef)]
            for func in functions:
                cls = getattr(module, classes[0].name) if classes else None
                for call in ast.walk(func):
                    if not (isinstance(call, ast.Call) and getattr(call.func, "id", None)
                            == "check_in_options" and len(call.args) == 3):
                        continue
                    name = ast.literal_eval(call.args[1])
                    where = f"{module.__name__}.{func.name}:{name}"
                    # evaluated where it is written: names, attributes and starred parts
                    options = eval(compile(ast.Expression(call.args[2]), where, "eval"),
                                   vars(module), {"self": cls, "cls": cls})
                    fn = getattr(cls if cls is not None else module, func.name)
                    validator = func.name.startswith(("_", "check_"))
                    if (module.__name__, name) in _OPTION_CHECK_OWNERS:
                        owners = [_public(p) for p in _OPTION_CHECK_OWNERS[module.__name__, name]]
                    elif _takes(fn, name) and not validator:  # the function's own parameter
                        owners = [fn]
                    elif cls is not None:
                        owners = _constructors_taking(cls, name)
                    else:
                        owners = []
                    found.append((where, name, tuple(options), owners))
    return found


OPTION_CHECKS = _option_checks()


def test_every_option_check_is_found():
    # the walk must see the option checks (an import or parse change must not empty it)
    assert len(OPTION_CHECKS) >= 45


@pytest.mark.parametrize("where, name, options, owners", OPTION_CHECKS,
                         ids=[c[0] for c in OPTION_CHECKS])
def test_option_checks_match_the_parameter_literal(where, name, options, owners):
    # an option set written twice (the Literal of the parameter, the options its check
    # accepts) must say the same: a value only in the check is refused by users' type
    # checkers, a value only in the Literal is advertised and then refused at run time
    assert owners, (f"{where}: no public parameter found for this check; add its owners "
                    "to _OPTION_CHECK_OWNERS")
    strings = {o for o in options if isinstance(o, str) and not o.startswith("<")}
    for owner in owners:
        hints = _hints_of(owner)
        assert name in hints, f"{owner.__qualname__}({name}=...) is checked but not annotated"
        assert _literal_values(hints[name]) == strings, owner.__qualname__
