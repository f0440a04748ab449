"""The typed user code of ``tests/typecheck``: mypy checks its ``assert_type`` calls
statically (CI); here it runs with ``assert_type`` replaced by a runtime check, so each
asserted type also holds for the value the call returns. And the lazy exports are visible
to type checkers."""

import ast
import importlib
import inspect
import types
import typing
from pathlib import Path

import pytest

import mlpapers
import mlpapers.datasets

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
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(_conforms, value, args))
    if origin is list:
        return isinstance(value, list) and all(_conforms(v, args[0]) for v in value)
    if origin is not None:  # another generic: its class only
        return isinstance(value, origin)
    return isinstance(value, _PROMOTIONS.get(tp, tp)) and not (
        tp in (int, float) and isinstance(value, bool))


def _assert_type_at_runtime(value, tp):
    assert _conforms(value, tp), f"expected {tp}, got {type(value).__name__}: {value!r:.200}"
    return value


@pytest.mark.parametrize("value, tp, ok", [
    (1.0, float, True), (1, float, True), (True, float, False), ("a", float, False),
    ((1, 2.0), tuple[int, float], True), ((1, 2.0), tuple[float], False),
    ((1.0, 2.0), tuple[float, ...], True), ([1, "a"], list[int], False),
    (None, int | None, True), ([[1]], list[list[int]], True), (2, typing.Literal[1, 2], True),
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
