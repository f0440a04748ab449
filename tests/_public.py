"""The package's modules and public classes, for the tests that sweep the whole API."""

import importlib
import numbers
import pkgutil
import re
from collections.abc import Iterator
from types import ModuleType

import numpy as np

import mlpapers

# optional extras whose absence leaves a module unimportable (it is then skipped)
OPTIONAL_IMPORTS = ("flwr",)


def package_modules(*, public_only: bool = True) -> Iterator[ModuleType]:
    """Every importable module of mlpapers, none under a private name when
    ``public_only``; never the command-line entry point (importing it runs the CLI)."""
    for info in pkgutil.walk_packages(mlpapers.__path__, prefix="mlpapers."):
        private = any(part.startswith("_") for part in info.name.split(".")[1:])
        if info.name == "mlpapers.__main__" or (public_only and private):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError as exc:  # an optional extra that is not installed
            if getattr(exc, "name", None) not in OPTIONAL_IMPORTS:
                raise
            continue
        yield module


def public_classes() -> list[type]:
    """The classes of mlpapers its public modules export, sorted by qualified name."""
    seen = {}
    for module in package_modules():
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if isinstance(obj, type) and obj.__module__.startswith("mlpapers."):
                seen[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [seen[k] for k in sorted(seen)]


def bad_value_like(value):
    """A value no parameter of ``value``'s kind accepts: ``"no"`` for a switch, NaN for
    a number, an unknown option for a string; None for any other kind."""
    if isinstance(value, (bool, np.bool_)):
        return "no"
    if isinstance(value, numbers.Real):
        return float("nan")
    if isinstance(value, str):
        return "no-such-option"
    return None


def names_param(param, message):
    """Whether ``message`` names ``param`` as a word (a one-letter argument such as
    ``p`` or ``X`` is found in almost any sentence)."""
    return re.search(rf"(?<![A-Za-z_]){re.escape(param)}(?![A-Za-z_])", message) is not None
