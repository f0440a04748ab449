"""The typed user code of ``tests/typecheck`` (mypy checks its annotations in CI) also
runs, so what it asserts about the types holds for the values too; and the lazy
exports are visible to type checkers."""

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import mlpapers
import mlpapers.datasets

CHECKS = sorted(p.stem for p in (Path(__file__).parent / "typecheck").glob("check_*.py"))


@pytest.mark.parametrize("name", CHECKS)
def test_typed_user_code_runs(name):
    importlib.import_module(f"tests.typecheck.{name}").check()


def _type_checking_imports(module) -> set[str]:
    """Names a module imports under ``if TYPE_CHECKING:``."""
    names = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                names.update(alias.name for alias in stmt.names)
    return names


@pytest.mark.parametrize("module, lazy", [
    (mlpapers, set(mlpapers._SUBMODULES)),
    (mlpapers.datasets, set(mlpapers.datasets._LAZY)),
])
def test_lazy_exports_are_declared_to_type_checkers(module, lazy):
    # a name served by the module's __getattr__ is Any to mypy and pyright unless the
    # module also imports it under TYPE_CHECKING
    assert _type_checking_imports(module) == lazy
