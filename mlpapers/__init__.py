"""mlpapers: ICML 2026 algorithms as tested, scikit-learn-style PyTorch estimators.

Submodules are imported lazily, so ``import mlpapers`` stays cheap and an
algorithm whose optional extras are missing never breaks the others::

    import mlpapers
    mlpapers.datasets.make_shifted_digits(random_state=0)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy imports below give, for type checkers and IDEs
    # (``import x as x``: an explicit re-export, for linters and strict checkers)
    from mlpapers import anomaly as anomaly
    from mlpapers import datasets as datasets
    from mlpapers import decentralized as decentralized
    from mlpapers import federated as federated
    from mlpapers import optim as optim
    from mlpapers import retrieval as retrieval
    from mlpapers import sampling as sampling
    from mlpapers import ssl as ssl

__version__ = "0.1.0.dev0"

_SUBMODULES = (
    "datasets",
    "optim",
    "retrieval",
    "federated",
    "sampling",
    "anomaly",
    "ssl",
    "decentralized",
)

__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES))
