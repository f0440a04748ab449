"""Registry of algorithms and their demos, used by ``python -m mlpapers``.

Each algorithm subpackage ``mlpapers/<domain>/<algo>/`` may contain a ``_demo.py``
that calls :func:`register` once. :func:`discover` imports those modules, so
adding an algorithm never requires editing a central list.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import mlpapers


@dataclass(frozen=True)
class DemoResult:
    """One row of the demo table: our method against a baseline on one metric."""

    method: str
    baseline: str
    metric: str
    value: float
    baseline_value: float
    time_s: float
    baseline_time_s: float
    higher_is_better: bool = True


@dataclass(frozen=True)
class Algorithm:
    """Metadata of one registered algorithm."""

    name: str
    module: str
    estimator: str
    paper: str
    arxiv: str
    demo: Callable[[bool], list[DemoResult]] = field(repr=False)


_REGISTRY: dict[str, Algorithm] = {}


def register(
    name: str, *, module: str, estimator: str, paper: str, arxiv: str
) -> Callable[[Callable[[bool], list[DemoResult]]], Callable[[bool], list[DemoResult]]]:
    """Decorator registering ``demo(quick: bool) -> list[DemoResult]`` under ``name``."""

    def wrap(demo):
        _REGISTRY[name] = Algorithm(name, module, estimator, paper, arxiv, demo)
        return demo

    return wrap


def discover() -> dict[str, Algorithm]:
    """Import every ``mlpapers.<domain>.<algo>._demo`` module and return the registry."""
    for info in pkgutil.walk_packages(mlpapers.__path__, prefix="mlpapers.", onerror=_skip):
        if info.name.endswith("._demo"):
            importlib.import_module(info.name)
    return dict(sorted(_REGISTRY.items()))


def _skip(name: str) -> None:  # a subpackage whose optional extra is missing
    return None
